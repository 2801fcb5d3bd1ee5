"""The records a run leaves: trajectories and groups, the JSON-lines files that hold them,
rewards that arrive late, and the loggers they are sent to.

`trajectory` (`Trajectory`, `TrajectoryGroup`, `LLMCall`, `ToolEvent`), `records` (every
JSONL file we write or read), `plain` (SDK objects to plain JSON), `late_rewards`,
`loggers` and `logger_protocol` (a backend's loggers). Nothing here talks to a server or
imports torch. The public names are exported from `art_langgraph`.
"""
