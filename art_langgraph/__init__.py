"""art_langgraph: train the LLM inside a LangGraph app with GRPO on a LoRA adapter.

The public surface, in ART's vocabulary. Subpackages hold the rest, in the order data
flows: `art_langgraph.tracing` (the chat model and the capturing transport: each call
becomes part of a trajectory), `art_langgraph.gathering` (rollouts and groups),
`art_langgraph.trajectories` (the records and their loggers), `art_langgraph.backend`
(the `Backend` contract, `LocalBackend`, `RemoteBackend`), `art_langgraph.training`
(GRPO), `art_langgraph.serving` (the OpenAI-compatible server), `art_langgraph.chat`
(chat templates), `art_langgraph.engine` (token-in/token-out inference),
`art_langgraph.presets` (the offline models), `art_langgraph.runtime` (plumbing).
`art_langgraph.utils` keeps ART's helpers. `import art_langgraph` does not import torch:
`LocalBackend` loads it on first use, `RemoteBackend` never does.
"""

from typing import TYPE_CHECKING

from art_langgraph import rewards
from art_langgraph.backend.choices import EngineChoice, ServerChoice, TrainerChoice
from art_langgraph.errors import (
    ArtError,
    ContextLengthError,
    InfrastructureError,
    MissingExtraError,
    ModelBehaviorError,
    NonFiniteRewardError,
    UnknownModelError,
    UsageError,
)
from art_langgraph.gathering.branch import branch
from art_langgraph.gathering.gather import gather_trajectories, gather_trajectory_groups
from art_langgraph.gathering.interrupts import ThreadStore, resume_reward
from art_langgraph.gathering.rollouts import rollouts
from art_langgraph.integrations.env import langfuse_loggers
from art_langgraph.integrations.trace_links import langfuse_trace_id
from art_langgraph.model import Model, TrainableModel, TrainResult
from art_langgraph.runtime.allocator import reexec_with_tcmalloc
from art_langgraph.runtime.lazy import lazy_getattr
from art_langgraph.tracing.callback import TrajectoryCallback
from art_langgraph.tracing.callback import register_trace_linker as _register_trace_linker
from art_langgraph.tracing.capture import capture, current_trajectory, derive_seed
from art_langgraph.tracing.chat_model import TrainableChatModel
from art_langgraph.training.config import ModelConfig, TrainConfig
from art_langgraph.trajectories import loggers as _loggers
from art_langgraph.trajectories.late_rewards import mark_pending, wait_for_rewards
from art_langgraph.trajectories.trajectory import (
    ExceptionInfo,
    LLMCall,
    ToolCall,
    ToolEvent,
    Trajectory,
    TrajectoryGroup,
    append_jsonl,
    read_groups,
    read_jsonl,
    write_jsonl,
)

if TYPE_CHECKING:
    from art_langgraph.backend.local import LocalBackend
    from art_langgraph.backend.remote import RemoteBackend

# The backends load on first use: `LocalBackend` brings torch, `RemoteBackend` does not.
__getattr__ = lazy_getattr(
    __name__,
    globals(),
    {
        "LocalBackend": "art_langgraph.backend.local",
        "RemoteBackend": "art_langgraph.backend.remote",
    },
)

# The loggers a backend given none takes from the environment (Langfuse's keys), and the
# trace a user's own Langfuse handler opened for a run (kept with its trajectory so the
# exported rollout joins that trace): registered here, above the integrations, since the
# backends and capture sit below them (tests/test_import_graph). Neither module imports
# an extra.
_loggers.register_env_factory(langfuse_loggers)
_register_trace_linker("langfuse", langfuse_trace_id, "langfuse_linked_trace_id")

__version__ = "0.1.0"

__all__ = [
    "ArtError",
    "ContextLengthError",
    "EngineChoice",
    "ExceptionInfo",
    "InfrastructureError",
    "LLMCall",
    "LocalBackend",
    "MissingExtraError",
    "Model",
    "ModelBehaviorError",
    "ModelConfig",
    "NonFiniteRewardError",
    "RemoteBackend",
    "ServerChoice",
    "ThreadStore",
    "ToolCall",
    "ToolEvent",
    "TrainConfig",
    "TrainResult",
    "TrainableChatModel",
    "TrainableModel",
    "TrainerChoice",
    "Trajectory",
    "TrajectoryCallback",
    "TrajectoryGroup",
    "UnknownModelError",
    "UsageError",
    "__version__",
    "append_jsonl",
    "branch",
    "capture",
    "current_trajectory",
    "derive_seed",
    "gather_trajectories",
    "gather_trajectory_groups",
    "mark_pending",
    "read_groups",
    "read_jsonl",
    "reexec_with_tcmalloc",
    "resume_reward",
    "rewards",
    "rollouts",
    "wait_for_rewards",
    "write_jsonl",
]
