"""The backend an `art_mcp` command runs on, from its `HarnessConfig`.

`backend_for` is shared by `train`/`check` (harness.py) and `art-mcp scenarios`
(scenario_source.py), so a flag that picks the engine (`engine`, `engine_dtype`,
`chat_template`) or a remote backend (`backend`) means the same in each; `machine_line`
says what an embedded one will run on, before it loads anything.

Left out: the backends themselves (art_langgraph.backend) and closing them (the caller
that built one closes it).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import art_langgraph as art
from art_langgraph.backend.base import Backend
from art_langgraph.runtime.devices import describe_machine, parameter_count
from art_mcp.config import HarnessConfig


def machine_line(cfg: HarnessConfig) -> str:
    """The machine and the dtypes an embedded backend picks for `cfg.base_model` here (the
    model's size decides them on a CPU that multiplies bfloat16 in hardware:
    `devices.pick_engine_dtype`); builds a preset's folder once, as the backend would."""
    from art_langgraph.presets import resolve_preset

    params = parameter_count(resolve_preset(cfg.base_model))
    return describe_machine(cfg.engine_dtype, cfg.compute_dtype, params)


def backend_for(cfg: HarnessConfig, backend: Backend | None, log: Callable[[str], None]) -> Backend:
    """The backend to run on: the one given, else a `RemoteBackend` (`cfg.backend`, with the
    key in `ART_API_KEY`), else an embedded `LocalBackend` with the engine settings of
    `cfg`. Engine settings beside a backend given or remote are reported through `log` and
    not applied (that backend keeps its own)."""
    engine_set = cfg.chat_template is not None or cfg.engine_dtype != "auto"
    if engine_set and (backend is not None or cfg.backend is not None):
        log(
            "chat_template and engine_dtype apply to an embedded backend this command "
            "builds; a backend given or remote keeps its own"
        )
    if backend is not None:
        return backend
    if cfg.backend is not None:
        return art.RemoteBackend(cfg.backend, api_key=os.environ.get("ART_API_KEY"))
    if cfg.engine == "vllm":
        from art_langgraph.engine import VLLMEngineConfig

        vllm_config = VLLMEngineConfig(chat_template=cfg.chat_template, dtype=cfg.engine_dtype)
        return art.LocalBackend(path=cfg.path, engine=art.EngineChoice("vllm", config=vllm_config))
    if engine_set:
        from art_langgraph.engine import TorchEngineConfig

        engine_config = TorchEngineConfig(
            chat_template=cfg.chat_template,
            dtype=None if cfg.engine_dtype == "auto" else cfg.engine_dtype,
        )
        return art.LocalBackend(
            path=cfg.path, engine=art.EngineChoice("torch", config=engine_config)
        )
    return art.LocalBackend(path=cfg.path, engine=cfg.engine)
