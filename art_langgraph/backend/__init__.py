"""The backend: the `Backend` contract, `LocalBackend` (embedded) and `RemoteBackend` (over
HTTP), and the model's folder on disk.

- `base`: the contract (`Backend`, `TrainResult`, and `ModelRef`: a model as a backend
  sees it, so the contract never imports `art_langgraph.model`);
- `local`: `LocalBackend`, engine + server + trainer in this process; `choices`: what it
  runs (`EngineChoice`, `TrainerChoice`, `ServerChoice`), `engines` and `trainers`: starting them;
- `remote`: `RemoteBackend`, the same contract over HTTP;
- `api/`: the training API over HTTP (`art-langgraph backend`: `api.server`, `api.wire`);
- `checkpoints`, `promotion`: the model's folder (atomic checkpoints, history, which
  step the bare name serves).

The OpenAI-compatible server is `art_langgraph.serving`.

The protocol, its records and `RemoteBackend` import without torch; the rest loads on
first use (a client that trains on another machine never imports torch)."""

from typing import TYPE_CHECKING

from art_langgraph.backend.base import Backend, ModelRef, TrainableModelRef, TrainResult
from art_langgraph.backend.choices import EngineChoice, ServerChoice, TrainerChoice
from art_langgraph.backend.promotion import PromotionDecision
from art_langgraph.runtime.lazy import lazy_getattr

if TYPE_CHECKING:
    from art_langgraph.backend.local import LocalBackend
    from art_langgraph.backend.remote import RemoteBackend

__getattr__ = lazy_getattr(
    __name__,
    globals(),
    {
        "LocalBackend": "art_langgraph.backend.local",
        "RemoteBackend": "art_langgraph.backend.remote",
    },
)

__all__ = [
    "Backend",
    "EngineChoice",
    "LocalBackend",
    "ModelRef",
    "PromotionDecision",
    "RemoteBackend",
    "ServerChoice",
    "TrainResult",
    "TrainableModelRef",
    "TrainerChoice",
]
