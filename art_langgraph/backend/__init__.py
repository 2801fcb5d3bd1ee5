"""The backend: the `Backend` contract, `LocalBackend` (embedded) and `RemoteBackend` (over
HTTP), and the model's folder on disk.

- `base`: the contract (`Backend`, `TrainResult`, and `ModelRef`: a model as a backend
  sees it, so the contract never imports `art_langgraph.model`);
- `local`: `LocalBackend`, engine + server + trainer in this process;
- `remote`: `RemoteBackend`, the same contract over HTTP;
- `api/`: the training API over HTTP (`art-langgraph backend`: `api.server`, `api.wire`);
- `checkpoints`, `promotion`: the model's folder (atomic checkpoints, history, which
  step the bare name serves).

The OpenAI-compatible server moved to `art_langgraph.serving`; this package still
exports its names of 0.1 (`ServerConfig`, `ModelRegistry`, `start_server`, ...) without a
warning, and the old module paths (`art_langgraph.backend.server`, `.runner`, ...) import
with a DeprecationWarning until 0.2.

The protocol, its records and `RemoteBackend` import without torch; the rest loads on
first use (a client that trains on another machine never imports torch)."""

from typing import TYPE_CHECKING

from art_langgraph._lazy import lazy_getattr
from art_langgraph.backend.base import Backend, ModelRef, TrainableModelRef, TrainResult
from art_langgraph.backend.promotion import PromotionDecision
from art_langgraph.serving.config import ServerConfig

if TYPE_CHECKING:
    from art_langgraph.backend.local import LocalBackend
    from art_langgraph.backend.remote import RemoteBackend
    from art_langgraph.serving.app import create_app
    from art_langgraph.serving.registry import ModelRegistry, Served
    from art_langgraph.serving.runner import ServerHandle, check_bind, serve, start_server

__getattr__ = lazy_getattr(
    __name__,
    globals(),
    {
        "LocalBackend": "art_langgraph.backend.local",
        "ModelRegistry": "art_langgraph.serving.registry",
        "RemoteBackend": "art_langgraph.backend.remote",
        "Served": "art_langgraph.serving.registry",
        "ServerHandle": "art_langgraph.serving.runner",
        "check_bind": "art_langgraph.serving.runner",
        "create_app": "art_langgraph.serving.app",
        "serve": "art_langgraph.serving.runner",
        "start_server": "art_langgraph.serving.runner",
    },
)

__all__ = [
    "Backend",
    "LocalBackend",
    "ModelRef",
    "ModelRegistry",
    "PromotionDecision",
    "RemoteBackend",
    "Served",
    "ServerConfig",
    "ServerHandle",
    "TrainResult",
    "TrainableModelRef",
    "check_bind",
    "create_app",
    "serve",
    "start_server",
]
