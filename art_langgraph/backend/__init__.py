"""The backend: the `Backend` contract, `LocalBackend` (embedded) and `RemoteBackend` (over
HTTP), the OpenAI-compatible server, its model registry and how to start it.

The protocol, its records and `RemoteBackend` import without torch; the rest loads on
first use (a client that trains on another machine never imports torch)."""

from typing import TYPE_CHECKING

from art_langgraph._lazy import lazy_getattr
from art_langgraph.backend.base import Backend, TrainResult
from art_langgraph.backend.promotion import PromotionDecision
from art_langgraph.backend.server_config import ServerConfig

if TYPE_CHECKING:
    from art_langgraph.backend.local import LocalBackend
    from art_langgraph.backend.registry import ModelRegistry, Served
    from art_langgraph.backend.remote import RemoteBackend
    from art_langgraph.backend.runner import ServerHandle, check_bind, serve, start_server
    from art_langgraph.backend.server import create_app

__getattr__ = lazy_getattr(
    __name__,
    globals(),
    {
        "LocalBackend": "art_langgraph.backend.local",
        "ModelRegistry": "art_langgraph.backend.registry",
        "RemoteBackend": "art_langgraph.backend.remote",
        "Served": "art_langgraph.backend.registry",
        "ServerHandle": "art_langgraph.backend.runner",
        "check_bind": "art_langgraph.backend.runner",
        "create_app": "art_langgraph.backend.server",
        "serve": "art_langgraph.backend.runner",
        "start_server": "art_langgraph.backend.runner",
    },
)

__all__ = [
    "Backend",
    "LocalBackend",
    "ModelRegistry",
    "PromotionDecision",
    "RemoteBackend",
    "Served",
    "ServerConfig",
    "ServerHandle",
    "TrainResult",
    "check_bind",
    "create_app",
    "serve",
    "start_server",
]
