"""The loggers a process's environment asks for (`loggers.loggers_from_env`, registered by
the package root): Langfuse when its keys are set.

This module imports no integration until the environment asks for one, so it loads
without the extras.

Left out: W&B (`integrations.wandb.WandbLogger` is passed as a logger; its environment
variables alone do not mean the user wants a run).
"""

from __future__ import annotations

import logging
import os

from art_langgraph.trajectories.logger_protocol import TrajectoryLogger

log = logging.getLogger(__name__)


def langfuse_loggers() -> list[TrajectoryLogger]:
    """A `LangfuseLogger` when LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY are set (and the
    `langfuse` extra is installed); else none. `ART_LANGFUSE=0` turns this off."""
    if os.environ.get("ART_LANGFUSE", "1") == "0":
        return []
    if not (os.environ.get("LANGFUSE_PUBLIC_KEY") and os.environ.get("LANGFUSE_SECRET_KEY")):
        return []
    try:
        from art_langgraph.integrations.langfuse import LangfuseLogger
    except ImportError as exc:
        log.warning(
            "LANGFUSE_* is set but the langfuse extra is not installed "
            "(pip install 'art-langgraph[langfuse]'): no traces are sent (%s)",
            exc,
        )
        return []
    return [LangfuseLogger()]
