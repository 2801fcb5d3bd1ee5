"""Shared fixtures: one tiny engine per test session, a real server on a free loopback port.

The tiny preset builds offline into the user cache (~/.cache/art_langgraph) once, and so
does the real `smollm2-135m` preset for the real-model tests (`smol_server`);
`lora_adapter` writes a real peft adapter (non-zero LoRA weights, so it changes the
outputs) into a temp folder.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import art_langgraph as art
from art_langgraph.engine import TorchEngine, TorchEngineConfig
from art_langgraph.presets import build_tiny
from art_langgraph.serving import ModelRegistry, ServerHandle, start_server
from tests.langgraph.tools import warm_start

API_KEY = "test-key-123"


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    return build_tiny()


FP32 = TorchEngineConfig(dtype="float32")
"""The engine tests that compare outputs exactly pin float32: `auto` picks bfloat16 for a
larger model on a host with AMX (`devices.FLOAT32_MAX_PARAMS`), and those tests must mean
the same whatever `auto`'s rule (bfloat16 has its own)."""

FP32_TRAINER = art.ModelConfig(dtype="float32", compute_dtype="float32")
"""The same for the trainer tests that compare two paths (prefix trees, segments, ranks)."""


@pytest.fixture(scope="session")
def engine(tiny_path: Path) -> Iterator[TorchEngine]:
    """The tiny model on the torch engine, float32 on every host."""
    eng = TorchEngine.from_pretrained(str(tiny_path), FP32)
    yield eng
    eng.close_sync()


@pytest.fixture(scope="session")
def registry() -> ModelRegistry:
    return ModelRegistry("tiny")


@pytest.fixture(scope="session")
def server(engine: TorchEngine, registry: ModelRegistry) -> Iterator[ServerHandle]:
    with start_server(engine, registry) as handle:
        yield handle


@pytest.fixture(scope="session")
def keyed_server(engine: TorchEngine, registry: ModelRegistry) -> Iterator[ServerHandle]:
    with start_server(engine, registry, api_key=API_KEY) as handle:
        yield handle


@pytest.fixture(scope="module")
def smol_server() -> Iterator[tuple[TorchEngine, ServerHandle]]:
    """A SmolLM2-135M-Instruct engine and server (served as "smol") for a file's real-model
    tests, built only if a test asks and freed when the file ends: the files that use it
    share a worker (`WORKER_GROUPS`), so one copy of its weights is in memory at a time,
    and the next group on that worker (the vLLM files) starts without it."""
    # the previous file's copy goes first: its stopped server's app sits in reference
    # cycles (FastAPI's, uvicorn's), which only a collection frees
    gc.collect()
    eng = TorchEngine.from_pretrained("smollm2-135m")
    with start_server(eng, ModelRegistry("smol")) as handle:
        yield eng, handle
    eng.close_sync()


@pytest.fixture(scope="session")
def lora_adapter(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A peft LoRA adapter for the tiny model with random, non-zero weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    cfg = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False
    )
    torch.manual_seed(1)
    peft_model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.mul_(8.0)  # strong enough that greedy outputs change
    out = tmp_path_factory.mktemp("adapter")
    peft_model.save_pretrained(out)
    return out


# One backend and one SFT-warm-started tool-calling model for the LangGraph and integration tests.
@pytest.fixture(scope="session")
async def lg_backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    async with art.LocalBackend(path=tmp_path_factory.mktemp("lg")) as backend:
        yield backend


@pytest.fixture(scope="session")
async def tool_model(lg_backend: art.LocalBackend) -> art.TrainableModel:
    """The tiny model after a short SFT on tool-call demonstrations (it calls tools, imperfectly)."""
    model = art.TrainableModel(name="toolagent", project="lg", base_model="tiny")
    await model.register(lg_backend)
    # 40 epochs, not the example's 20: after 20 the model's calls were valid on one machine
    # and mostly `{}` on another (1 good call of 8 at temperature 0; 5 of 8 after 40).
    await warm_start(model, epochs=40)
    return model


@pytest.fixture
async def fresh_model(
    lg_backend: art.LocalBackend, request: pytest.FixtureRequest
) -> art.TrainableModel:
    """An untrained model with a name of its own (a test may train it)."""
    model = art.TrainableModel(
        name=f"m-{request.node.name[:40]}".replace("[", "-").replace("]", ""),
        project="lg",
        base_model="tiny",
    )
    await model.register(lg_backend)
    return model


LONG = "long"
"""The group of the tests that take many minutes alone (the BFCL learning arm and the main
job, each a real-model run in a subprocess of its own): handed out first, so one worker
runs them one after the other while the other takes the rest, and neither ends the run."""

WORKER_GROUPS = {
    "tests/engine/test_vllm_engine.py": "vllm",
    "tests/scaleout/test_vllm_replicas.py": "vllm",
    "tests/langgraph/test_drift_real.py": "smol",
    "tests/mcp/test_real_model.py": "smol",
    "tests/mcp/test_turns_extend.py": "smol",
    "tests/presets/test_smollm2.py": "smol",
    "tests/examples/test_bfcl_learning.py": LONG,
    "tests/test_demo.py": LONG,
}
"""Files that share a pytest-xdist worker (the test command runs two): every file with a
`vllm` test, so two vLLM servers never run at once, and every file with a SmolLM2 test
(`smol_server`), so one copy of the real model is loaded. Any other file is a group of its
own, so its module fixtures start once. Collection fails when a file is missing here."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's `loadscope` scheduling, by `WORKER_GROUPS` instead of by file.

    Its own `--dist loadgroup` does not group on pytest 9.2, which no longer reads the
    node id that xdist 3.8 rewrites."""
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    # the order is pytest_collection_modifyitems' (the long group first), not xdist's own
    # by number of tests, which would hand out a group of one long test last
    config.option.loadscopereorder = False
    return FileGroups(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` tests cleanly without CUDA, and `vllm` tests without a vLLM environment;
    with $ART_REQUIRE_VLLM=1 (the test command sets it) a missing vLLM is a failure; `bfcl`
    tests likewise without BFCL's environment, and $ART_REQUIRE_BFCL. A
    `vllm` or SmolLM2 test in a file outside its `WORKER_GROUPS` group is an error."""
    import os

    import torch

    from art_langgraph.engine.vllm_config import vllm_python

    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    no_vllm = pytest.mark.skip(reason="needs vLLM: scripts/setup-vllm.sh, or $ART_VLLM_PYTHON")
    no_bfcl = pytest.mark.skip(reason="needs BFCL's environment: scripts/setup-bfcl.sh")
    has_bfcl = _has_bfcl()
    if (
        not has_bfcl
        and any("bfcl" in item.keywords for item in items)
        and os.environ.get("ART_REQUIRE_BFCL") == "1"
    ):
        raise pytest.UsageError(
            "ART_REQUIRE_BFCL=1 but no BFCL environment: run scripts/setup-bfcl.sh"
        )
    has_vllm = vllm_python() is not None
    wanted = any("vllm" in item.keywords for item in items)
    if not has_vllm and wanted and os.environ.get("ART_REQUIRE_VLLM") == "1":
        raise pytest.UsageError(
            "ART_REQUIRE_VLLM=1 but no vLLM environment: run scripts/setup-vllm.sh"
        )
    _long_first(items)
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = "vllm" if "vllm" in item.keywords else "smol" if _uses_smol(item) else None
        if group is not None and WORKER_GROUPS.get(path) != group:
            raise pytest.UsageError(f"{path}: add it to WORKER_GROUPS as {group!r}")
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "vllm" in item.keywords and not has_vllm:
            item.add_marker(no_vllm)
        if "bfcl" in item.keywords and not has_bfcl:
            item.add_marker(no_bfcl)


def _group(nodeid: str) -> str:
    """A test's worker group: its file's in `WORKER_GROUPS`, else its file."""
    path = nodeid.split("::", 1)[0]
    return WORKER_GROUPS.get(path, path)


def _long_first(items: list[pytest.Item]) -> None:
    """Order `items` as pytest-xdist hands out their groups: the long group first, then
    the groups with more tests before those with fewer (xdist's own order, which
    `pytest_xdist_make_scheduler` turns off), in the order they were collected."""
    groups = [_group(i.nodeid) for i in items]
    size: dict[str, int] = {}
    first: dict[str, int] = {}
    for k, g in enumerate(groups):
        size[g] = size.get(g, 0) + 1
        first.setdefault(g, k)
    order = sorted(
        range(len(items)), key=lambda k: (groups[k] != LONG, -size[groups[k]], first[groups[k]], k)
    )
    items[:] = [items[k] for k in order]


def _has_bfcl() -> bool:
    from examples.bfcl.checker import bfcl_python

    try:
        bfcl_python()
    except FileNotFoundError:
        return False
    return True


def _uses_smol(item: pytest.Item) -> bool:
    return "smol_server" in getattr(item, "fixturenames", ())
