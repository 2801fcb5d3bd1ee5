"""Rollouts and groups: running a graph many times, each run captured and scored.

`rollouts` (`rollouts()`: one GRPO group of one input), `gather` (`gather_trajectory_groups`,
`gather_trajectories`), `branch` (a group continuing one saved checkpoint), `interrupts`
(runs that stop at a LangGraph `interrupt()` and resume later). Training on the groups is
the backend's. The public names are exported from `art_langgraph`.
"""
