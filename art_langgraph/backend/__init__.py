"""The backend: the `Backend` contract, the OpenAI-compatible server, its model registry and
how to start it."""

from art_langgraph.backend.base import Backend, TrainResult
from art_langgraph.backend.registry import ModelRegistry, Served
from art_langgraph.backend.runner import ServerHandle, check_bind, serve, start_server
from art_langgraph.backend.server import create_app
from art_langgraph.backend.server_config import ServerConfig

__all__ = [
    "Backend",
    "ModelRegistry",
    "Served",
    "ServerConfig",
    "ServerHandle",
    "TrainResult",
    "check_bind",
    "create_app",
    "serve",
    "start_server",
]
