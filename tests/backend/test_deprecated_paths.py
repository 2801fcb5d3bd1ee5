"""The backend modules of 0.1 that moved still import, warn, and give the new objects.

The OpenAI-compatible server moved from `art_langgraph.backend` to `art_langgraph.serving`,
the training API's server and wire format to `art_langgraph.backend.api`. Each old module
path warns when imported (DeprecationWarning) until 0.2; `art_langgraph.backend` itself
keeps its names of 0.1 without a warning.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import art_langgraph.backend as backend

MOVED = {
    "server": "art_langgraph.serving.app",
    "chat_service": "art_langgraph.serving.chat_service",
    "responses": "art_langgraph.serving.responses",
    "guard": "art_langgraph.serving.guard",
    "server_config": "art_langgraph.serving.config",
    "protocol": "art_langgraph.serving.chat_protocol",
    "responses_protocol": "art_langgraph.serving.responses_protocol",
    "runner": "art_langgraph.serving.runner",
    "metrics": "art_langgraph.serving.metrics",
    "registry": "art_langgraph.serving.registry",
    "backend_server": "art_langgraph.backend.api.server",
    "wire": "art_langgraph.backend.api.wire",
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_warns_and_gives_the_same_objects(old: str) -> None:
    path, new = f"art_langgraph.backend.{old}", MOVED[old]
    sys.modules.pop(path, None)  # a module warns when it is first imported
    with pytest.warns(DeprecationWarning, match=rf"{path} moved to {new}; .* 0\.2"):
        shim = importlib.import_module(path)
    home = importlib.import_module(new)
    # the shim's __all__ is 0.1's, frozen; the new module may have grown since
    assert shim.__all__ and set(shim.__all__) <= set(home.__all__)
    for name in shim.__all__:
        assert getattr(shim, name) is getattr(home, name), name
    private = next((n for n in vars(home) if n.startswith("_") and not n.startswith("__")), None)
    if private is not None:  # a helper outside __all__ resolves too
        assert getattr(shim, private) is getattr(home, private)


def test_the_old_paths_work_in_a_fresh_process() -> None:
    """`from art_langgraph.backend.server import create_app` as 0.1 code wrote it."""
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        "    from art_langgraph.backend.server import create_app\n"
        "except DeprecationWarning as e:\n"
        "    print(e)\n"
        "warnings.simplefilter('ignore')\n"
        "from art_langgraph.backend.server import create_app\n"
        "from art_langgraph.serving.app import create_app as new\n"
        "assert create_app is new\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "moved to art_langgraph.serving.app" in out.stdout


def test_the_backend_package_keeps_its_names_without_a_warning() -> None:
    old_all = [
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
    assert set(old_all) <= set(backend.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in backend.__all__:
            assert getattr(backend, name) is not None, name
    import art_langgraph.serving as serving

    for name in set(old_all) & set(serving.__all__):
        assert getattr(backend, name) is getattr(serving, name), name
