"""Where a run's scenarios come from: given, saved by an earlier run, or generated.

`run_scenarios` is what `art_mcp.train` uses: the scenarios given (a list or a JSONL
file), else those a resumed run saved in the model's folder (`scenarios.jsonl`), else
`n_scenarios` generated from the server's tools (`generate_scenarios`) by
`config.generator`, or by the model being trained when none is named, and saved.
`write_scenarios` (`art-mcp scenarios`) only generates and writes them, so a person can
read and edit them before training.

Left out: how scenarios are generated, checked and split (scenarios.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import art_langgraph as art
from art_langgraph.backend.base import Backend
from art_mcp.backends import backend_for
from art_mcp.config import HarnessConfig
from art_mcp.progress import say
from art_mcp.scenarios import Scenario, generate_scenarios, load_scenarios, save_scenarios
from art_mcp.scoring import litellm_route
from art_mcp.toolset import MCPToolset


async def run_scenarios(
    given: list[Scenario] | str | Path | None,
    cfg: HarnessConfig,
    toolset: MCPToolset,
    model: art.Model,
    folder: Path,
    log: Callable[[str], None],
) -> list[Scenario]:
    if isinstance(given, list):
        return given
    if given is not None:
        return load_scenarios(given)
    saved = folder / "scenarios.jsonl"
    if saved.exists():  # a resumed run keeps its scenarios
        return load_scenarios(saved)
    generator = cfg.generator
    if generator is None:
        log(
            "no --scenarios and no --generator: generating scenarios with the model being "
            "trained (--generator local); a stronger generator writes better ones"
        )
        generator = "local"
    base_url = api_key = None
    source = generator
    if generator == "local":
        generator, base_url, api_key = litellm_route(model)
    scen = await _generate(toolset, cfg, (generator, base_url, api_key), log)
    save_scenarios(saved, scen)
    log(f"generated {len(scen)} scenarios with {source} -> {saved}")
    return scen


async def _generate(
    toolset: MCPToolset,
    cfg: HarnessConfig,
    route: tuple[str, str | None, str | None],
    log: Callable[[str], None],
) -> list[Scenario]:
    """`generate_scenarios` with the run's settings; `route`: the generator, its base URL
    and key, as litellm takes them."""
    generator, base_url, api_key = route
    return await generate_scenarios(
        toolset,
        cfg.n_scenarios,
        generator=generator,
        base_url=base_url,
        api_key=api_key,
        instructions=cfg.instructions,
        require_tool_words=cfg.scenario_tool_words,
        log=log,
    )


async def write_scenarios(
    server: Any,
    out: str | Path,
    config: HarnessConfig | None = None,
    *,
    env: dict[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Scenario]:
    """Generate `config.n_scenarios` scenarios for `server`'s tools, write them to `out`
    (JSONL) and stop, so a person can read and edit them before training
    (`art-mcp scenarios`). The generator is `config.generator`; 'local' (the default) is
    `config.base_model` served by the backend `config` picks (backends.py)."""
    cfg = config or HarnessConfig()
    tell = log or say
    out = Path(out)
    generator = cfg.generator or "local"
    if generator == "local":
        from art_langgraph.presets import check_base_model

        check_base_model(cfg.base_model)
    toolset = MCPToolset(server, env=env, allow_tools=cfg.allow_tools, deny_tools=cfg.deny_tools)
    backend: Backend | None = None
    try:
        await toolset.start()
        base_url = api_key = None
        if generator == "local":
            backend = backend_for(cfg, None, tell)
            writer = art.Model(
                name="scenario-writer", project=cfg.project, base_model=cfg.base_model
            )
            await writer.register(backend)
            generator, base_url, api_key = litellm_route(writer)
            tell(
                f"writing scenarios with {cfg.base_model}: a small model writes weak tasks; "
                "--generator takes any litellm model (openai/gpt-4o-mini, ...)"
            )
        scen = await _generate(toolset, cfg, (generator, base_url, api_key), tell)
    finally:
        await toolset.close()
        if backend is not None:
            await backend.close()
    save_scenarios(out, scen)
    for s in scen:
        tell(f"- {s.task}")
    tell(
        f"{len(scen)} scenarios for {len(toolset.tools)} tools -> {out}; review them, then "
        f"art-mcp train --scenarios {out} ..."
    )
    return scen
