"""The OpenAI-compatible server: what answers `/v1/chat/completions`, `/v1/responses`,
`/v1/models`, `/health` and `/metrics` for the models an engine serves.

Why a package of its own, beside `engine/` and `training/` rather than inside `backend/`:
the server needs an engine and a registry of served names, never a backend or a trainer
(`art-langgraph serve` serves a base model with no training at all), while a backend
composes the three (`LocalBackend` starts this server). So the import arrow points one
way, `backend -> serving -> engine`, and a reader looking for "the server" and one
looking for "the backend" no longer land in the same folder.

Modules:

- `app`: the routes (`create_app`, FastAPI); they only move bytes;
- `chat_service`, `chat_protocol`: the chat-completions translation (request -> engine
  plan -> typed response) and its wire types;
- `responses`, `responses_protocol`: OpenAI's Responses API on the same plans, and its
  wire types (pure: the capturing client imports them without torch);
- `registry`: which names (`name`, `name@step`, `name@latest`) the server answers to;
- `guard`: the outer ASGI layer (Host, keys, content types, sizes);
- `config`: the limits and timeouts (`ServerConfig`);
- `metrics`: `GET /metrics` in Prometheus text;
- `runner`: starting it, in a thread (`start_server`) or in the foreground (`serve`).

Left out: training (`art_langgraph.backend`), the engines (`art_langgraph.engine`).
`ServerConfig` imports without torch; the rest loads on first use.
"""

from typing import TYPE_CHECKING

from art_langgraph.runtime.lazy import lazy_getattr
from art_langgraph.serving.config import ServerConfig

if TYPE_CHECKING:
    from art_langgraph.serving.app import create_app
    from art_langgraph.serving.registry import ModelRegistry, Served
    from art_langgraph.serving.runner import (
        ServerHandle,
        check_bind,
        serve,
        start_app_server,
        start_server,
    )

__getattr__ = lazy_getattr(
    __name__,
    globals(),
    {
        "ModelRegistry": "art_langgraph.serving.registry",
        "Served": "art_langgraph.serving.registry",
        "ServerHandle": "art_langgraph.serving.runner",
        "check_bind": "art_langgraph.serving.runner",
        "create_app": "art_langgraph.serving.app",
        "serve": "art_langgraph.serving.runner",
        "start_app_server": "art_langgraph.serving.runner",
        "start_server": "art_langgraph.serving.runner",
    },
)

__all__ = [
    "ModelRegistry",
    "Served",
    "ServerConfig",
    "ServerHandle",
    "check_bind",
    "create_app",
    "serve",
    "start_app_server",
    "start_server",
]
