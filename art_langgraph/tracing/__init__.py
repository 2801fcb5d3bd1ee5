"""Capture: from a call in the user's app to a `Trajectory`, on one path.

`chat_model` (`TrainableChatModel`, LangChain's side), `openai_capture` (the capturing
transport every request of `model.openai_client()` and `model.chat_model()` goes
through), `callback` (`TrajectoryCallback`: graph position, tool calls, metadata),
`capture` (`capture()`, `current_trajectory()`, the context a run records into). Running
a graph many times is `art_langgraph.gathering`'s. The public names are exported from
`art_langgraph`.
"""
