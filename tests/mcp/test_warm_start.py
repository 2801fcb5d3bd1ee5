"""The warm start's probe: which scenarios it holds back, its rule, its journal, a restart
mid-way, and epochs trained one call each as one call trains them. The runs are on the
tiny preset and the bundled capitals server and scenarios (128 demonstrations)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import art_langgraph as art
from art_mcp import HarnessConfig, Scenario, load_scenarios, train
from art_mcp.report import read_journal
from art_mcp.warm_start import entity, probe_size, probe_split, progress
from tests.conftest import FP32
from tests.mcp.interrupt import run_until

ROOT = Path(__file__).resolve().parents[2]
SERVER = "python -m examples.mcp_server.server"
SCENARIOS = ROOT / "examples/mcp_server/scenarios.jsonl"


def _train_set() -> list[Scenario]:
    return [s for s in load_scenarios(SCENARIOS) if s.split == "train"]


def test_the_probe_is_at_most_one_demonstration_in_sixteen_and_none_below_four() -> None:
    assert probe_size(128, 8) == 8
    assert probe_size(64, 8) == 4
    assert probe_size(63, 8) == 0  # three would say too little
    assert probe_size(1000, 8) == 8 and probe_size(1000, 0) == 0


def test_the_probe_holds_back_whole_entities_drawn_by_the_seed() -> None:
    scen = _train_set()
    taught, probe = probe_split(scen, 8, seed=1)
    assert len(probe) == 8 and len(taught) == 120
    assert {entity(s) for s in probe}.isdisjoint(entity(s) for s in taught)  # whole entities
    assert [s.id for s in taught] == [s.id for s in scen if s not in probe]  # order kept
    again, other = probe_split(scen, 8, seed=1)[1], probe_split(scen, 8, seed=2)[1]
    assert [s.id for s in again] == [s.id for s in probe] and other != probe
    assert probe_split(scen, 0, seed=1) == (scen, [])
    # without an entity, a scenario is its own
    bare = [Scenario(id=f"q{i}", task="t", demonstration=[{"role": "user"}]) for i in range(8)]
    assert len(probe_split(bare, 3, seed=0)[1]) == 3


def test_progress_reads_the_journal() -> None:
    assert progress([]) == progress([{"kind": "step"}])
    state = progress([{"kind": "warm_start", "epoch": 0}, {"kind": "warm_start", "epoch": 1}])
    assert state.begun and state.epochs == 1 and not state.finished
    assert progress([{"kind": "warm_start", "epoch": 2, "done": True}]).finished


def _cfg(tmp_path: Path, **kw: object) -> HarnessConfig:
    base: dict[str, object] = {
        "path": str(tmp_path),
        "base_model": "tiny",
        "steps": 0,
        "max_tokens": 24,
        "max_turns": 2,
        "eval_scenarios": 2,
        "eval_samples": 0,
        "eval_untrained": False,
    }
    return HarnessConfig(**{**base, **kw})  # type: ignore[arg-type]


def _warm_records(folder: Path) -> list[dict[str, object]]:
    return [r for r in read_journal(folder) if r["kind"] == "warm_start"]


def _cli(path: Path, interrupt_after: str | None = None) -> str:
    """`art-mcp train` of a two-epoch warm start alone, as a user runs it; with
    `interrupt_after`, Ctrl-C (SIGINT) as soon as a line containing it is printed. Its
    output."""
    cmd = [
        sys.executable, "-m", "art_mcp.cli", "train", "--server", SERVER,
        "--scenarios", str(SCENARIOS), "--reward", "examples.mcp_server.tasks:score",
        "--path", str(path), "--steps", "0", "--sft-epochs", "2", "--max-tokens", "24",
        "--max-turns", "2", "--eval-scenarios", "2", "--eval-samples", "0",
        "--eval-untrained", "false", "--base-model", "tiny",
    ]  # fmt: skip
    run = run_until(cmd, ROOT, interrupt_after)
    assert interrupt_after is not None or run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.slow
def test_a_probed_warm_start_runs_epoch_by_epoch_and_resumes_after_ctrl_c(
    tmp_path: Path,
) -> None:
    """Each epoch is a checkpoint and a journal record; the probe runs after each epoch but
    the last (the tiny model fails it, so every epoch runs); a run stopped after a probe
    goes on from the epochs its folder holds, training none twice, and ends the warm
    start's record."""
    cut = _cli(tmp_path, "warm-start probe after epoch 1")
    assert "SFT warm start on 120 demonstrations: epoch 1 of 2 in " in cut
    assert "warm-start probe after epoch 1: 0 of 8 held-back training scenarios" in cut
    (folder,) = (tmp_path / "mcp" / "models").iterdir()
    records = _warm_records(folder)
    assert [r["epoch"] for r in records][:2] == [0, 1] and records[1]["probe_passed"] == 0
    assert len(records[0]["probe"]) == 8  # type: ignore[arg-type]
    # The tiny model's epoch takes about a second: under load the Ctrl-C can land after
    # epoch 2's checkpoint is saved, its record not yet written. Either way the resumed run
    # trains no epoch twice, and epoch 2 only where no checkpoint of it was saved.
    epoch_2_saved = (folder / "checkpoints" / "0002").is_dir()
    rest = _cli(tmp_path)
    assert "epoch 1 of 2" not in rest and "after epoch 2" not in rest
    assert ("epoch 2 of 2" in rest) != epoch_2_saved, (epoch_2_saved, rest[-2000:])
    assert [r["epoch"] for r in _warm_records(folder)] == [0, 1, 2]
    assert _warm_records(folder)[-1]["done"] is True
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["0001", "0002"]
    report = json.loads((folder / "report.json").read_text())
    assert [(e["step"], e["rl_step"]) for e in report["evaluations"]] == [(2, 0)]


@pytest.mark.slow
async def test_one_epoch_or_a_zero_probe_warm_starts_in_one_call_on_every_demonstration(
    tmp_path: Path,
) -> None:
    for name, kw in (("one", {"sft_epochs": 1}), ("none", {"sft_epochs": 2, "sft_probe": 0})):
        said: list[str] = []
        await train(
            SERVER, _cfg(tmp_path / name, **kw), scenarios=SCENARIOS,
            reward="examples.mcp_server.tasks:score", log=said.append,
        )  # fmt: skip
        text = "\n".join(said)
        assert "SFT warm start on 128 demonstrations: " in text and "warm-start probe" not in text
        (folder,) = (tmp_path / name / "mcp" / "models").iterdir()
        assert not _warm_records(folder)
        assert [p.name for p in (folder / "checkpoints").iterdir()] == ["0001"]


@pytest.mark.slow
async def test_epochs_trained_a_call_each_train_as_one_call(tmp_path: Path) -> None:
    """The probed warm start's premise: the trainer's optimizer carries over between
    `train_sft` calls, so two one-epoch calls give the adapter one two-epoch call gives."""
    from safetensors.torch import load_file

    convos = [
        [{"role": "user", "content": f"Say {i}"}, {"role": "assistant", "content": f"ok {i}"}]
        for i in range(16)
    ]
    lr = art.TrainConfig(learning_rate=5e-3)
    async with art.LocalBackend(path=tmp_path, engine=art.EngineChoice(config=FP32)) as backend:
        adapters = {}
        for name, calls in (("once", [2]), ("twice", [1, 1])):
            model = art.TrainableModel(name=name, project="p", base_model="tiny")
            await model.register(backend)
            for epochs in calls:
                await model.train_sft(convos, lr, epochs=epochs)
            folder = tmp_path / "p" / "models" / name / "checkpoints"
            last = sorted(folder.iterdir())[-1]
            adapters[name] = load_file(last / "adapter_model.safetensors")
    once, twice = adapters["once"], adapters["twice"]
    assert once.keys() == twice.keys()
    for k in once:
        assert (once[k] - twice[k]).abs().max() < 1e-5, k
    assert json.dumps(sorted(once)) == json.dumps(sorted(twice))


@pytest.mark.slow
async def test_replay_trains_a_draw_of_demonstrations_after_each_rl_step(tmp_path: Path) -> None:
    """`sft_replay`: each RL step is followed by one SFT step on that many demonstrations;
    the RL steps stay the run's GRPO steps, and the evaluation after the last step is of the
    weights after its replay."""
    from art_mcp.report import grpo_steps, journal_evaluations

    said: list[str] = []
    cfg = _cfg(tmp_path, sft_epochs=1, steps=2, sft_replay=4, group_size=2, groups_per_step=2)
    report = await train(
        SERVER, cfg, scenarios=SCENARIOS, reward="examples.mcp_server.tasks:score",
        log=said.append,
    )  # fmt: skip
    text = "\n".join(said)
    assert text.count("and one replay step on demonstrations") == 2
    last = report.rows[-1]  # RL step 2's row holds the evaluation of its replayed weights
    assert last["rl_step"] == 2 and last["val_greedy_success"] == last["val_greedy_success"]
    (folder,) = (tmp_path / "mcp" / "models").iterdir()
    history = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    sft = [h for h in history if "sft_steps" in h]
    assert len(sft) == 3  # the warm start, then one replay after each RL step
    assert max(p.name for p in (folder / "checkpoints").iterdir()) == "0005"
    journal = read_journal(folder)
    assert [r["step"] for r in grpo_steps(folder, journal)] == [2, 4]
    assert max(e.step for e in journal_evaluations(journal)) == 5
