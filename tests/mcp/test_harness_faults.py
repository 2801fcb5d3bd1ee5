"""`art_mcp.train` when things go wrong: a reward that raises, model calls the server
refuses, steps with nothing to train, a judge-only run's evaluation, Ctrl-C at several points and the resumed report, a
recipe that changed under a model's name. All on the tiny preset and the bundled server."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import art_langgraph as art
from art_mcp import HarnessConfig, Scenario, load_scenarios, train
from art_mcp.recipe import default_name, recipe_of
from tests.mcp.interrupt import run_until

ROOT = Path(__file__).resolve().parents[2]
SERVER = "python -m examples.mcp_server.server"
SCENARIOS = ROOT / "examples/mcp_server/scenarios.jsonl"

pytestmark = pytest.mark.slow


def _cfg(tmp_path: Path, **kw: object) -> HarnessConfig:
    base: dict[str, object] = {
        "path": str(tmp_path),
        "base_model": "tiny",
        "group_size": 2,
        "groups_per_step": 2,
        "sft_epochs": 0,
        "max_tokens": 24,
        "max_turns": 2,
        "tool_choice": "required",
        "eval_scenarios": 2,
        "eval_samples": 1,
        "val_fraction": 0.1,
    }
    return HarnessConfig(**{**base, **kw})  # type: ignore[arg-type]


async def test_a_raising_reward_is_counted_and_a_flat_step_says_it_trained_nothing(
    tmp_path: Path,
) -> None:
    calls = itertools.count()

    def reward(traj: art.Trajectory, s: Scenario) -> float:
        n = next(calls)
        if n % 4 == 1:
            raise KeyError(f"no field in episode {n}")
        if n % 4 == 3:
            return float("nan")
        return 0.5  # every other episode the same: no group has variance

    said: list[str] = []
    report = await train(
        SERVER, _cfg(tmp_path, steps=1), scenarios=SCENARIOS, reward=reward, log=said.append
    )
    text = "\n".join(said)
    # held out: scored 0 and counted, with the first traceback; the evaluation finished
    assert (
        "the untrained model's held-out evaluation: the reward function raised in 2 episodes"
        in text
    )
    first = text.split("episodes (scored 0); first:\n", 1)[1]
    assert first.startswith("Traceback") and ("KeyError: 'no field" in first or "nan" in first)
    assert len(report.evaluations) == 1 and len(report.evaluations[0].greedy) == 2
    # the step trained on nothing: its adapter is the one evaluated, which stands for it
    assert "RL step 1: train reward" in text and "held-out not evaluated again" in text
    # training: the failed rollouts dropped and counted; the step trained on nothing, said so
    assert "RL step 1: the reward function raised in" in text and "(dropped)" in text
    assert "TRAINED ON NOTHING" in text and report.untrained_steps == [1]
    # progress, a line per phase (no terminal here)
    # ... with what the embedded engine computed: prompt tokens, the cache's share, output
    engine = r"; engine: \d+k? prompt tokens \(\d+% from its prefix cache\), \d+k? generated"
    # and this process's memory high-water mark so far, which never falls
    peak = r"; peak RSS (\d+\.\d\d) GiB"
    assert re.search(r"RL step 1: \d of 4 rollouts in \d+ s" + engine + peak + "; training", text)
    assert re.search(r"RL step 1: trained 0 micro-batches \(0 tokens\) in \d+ s" + peak, text)
    assert re.search(
        r"the untrained model's held-out evaluation: 4 episodes in \d+ s" + engine + peak, text
    )
    peaks = [float(x) for x in re.findall(peak, text)]
    assert len(peaks) >= 3 and peaks == sorted(peaks) and peaks[0] > 0.1, peaks
    assert "1 of 1 RL steps trained on nothing" in (Path(report.folder) / "report.md").read_text()


async def test_episodes_a_refused_model_call_stopped_are_counted_and_named(
    tmp_path: Path,
) -> None:
    # a chat template that refuses to render: every model call fails at the server
    template = tmp_path / "refuses.jinja"
    template.write_text("{{ raise_exception('the custom template refused') }}")
    said: list[str] = []
    await train(
        SERVER,
        _cfg(tmp_path, steps=1, chat_template=str(template)),
        scenarios=SCENARIOS,
        reward=lambda traj, s: 0.0,
        log=said.append,
    )
    text = "\n".join(said)
    assert "the untrained model's held-out evaluation: 4 episodes stopped with an error" in text, (
        text
    )
    assert "RL step 1: 4 episodes stopped with an error (scored as they ended)" in text
    assert "the custom template refused" in text.split("with an error", 1)[1]
    assert "RL step 1 pre-flight: change the setup: 4 episodes stopped with an error" in text


async def test_a_judge_only_run_evaluates_with_the_judge(tmp_path: Path) -> None:
    report = await train(
        SERVER, _cfg(tmp_path, steps=0, judge="local"), scenarios=SCENARIOS, log=lambda _: None
    )
    assert report.scored_by == "RULER judge"
    (f,) = (Path(report.folder) / "trajectories" / "untrained").iterdir()
    trajs = [t for line in f.read_text().splitlines() for t in json.loads(line)["trajectories"]]
    assert len(trajs) == 4  # 2 scenarios x (greedy + 1 sample)
    assert all("ruler_score" in t["metrics"] for t in trajs)  # not 0.00 by construction
    assert all(t["reward"] == t["metrics"]["ruler_score"] for t in trajs)


async def test_a_changed_recipe_stops_before_resuming_a_model_by_its_name(tmp_path: Path) -> None:
    def flat(traj: art.Trajectory, s: Scenario) -> float:
        return 0.0

    cfg = _cfg(tmp_path, steps=0, name="mine", eval_samples=0)
    await train(SERVER, cfg, scenarios=SCENARIOS, reward=flat, log=lambda _: None)
    with pytest.raises(art.UsageError, match=r"another recipe \(reward changed.*--allow-recipe"):
        await train(SERVER, cfg, scenarios=SCENARIOS, reward="examples.mcp_server.tasks:score")
    ok = cfg.model_copy(update={"allow_recipe_change": True})
    await train(
        SERVER,
        ok,
        scenarios=SCENARIOS,
        reward="examples.mcp_server.tasks:score",
        log=lambda _: None,
    )
    # without a name, the recipe is in the default name: another reward is another model
    scen = load_scenarios(SCENARIOS)
    a = recipe_of(SERVER, cfg, scen, "examples.mcp_server.tasks:score")
    b = recipe_of(SERVER, cfg, scen[1:], "examples.mcp_server.tasks:score")
    c = recipe_of(
        SERVER, cfg.model_copy(update={"judge": "local"}), scen, "examples.mcp_server.tasks:score"
    )
    assert len({default_name(SERVER, "tiny", r) for r in (a, b, c)}) == 3
    assert default_name(SERVER, "tiny", a) == default_name(SERVER, "tiny", dict(a))


def _run(tmp_path: Path, interrupt_after: str | None) -> subprocess.CompletedProcess[str]:
    """`art-mcp train` as a user runs it; with `interrupt_after`, Ctrl-C (SIGINT) as soon
    as a line containing it is printed."""
    cmd = [
        sys.executable, "-m", "art_mcp.cli", "train", "--server", SERVER,
        "--scenarios", str(SCENARIOS), "--reward", "tests.mcp.alternating:score",
        "--path", str(tmp_path), "--steps", "2", "--eval-every", "1", "--group-size", "2",
        "--groups-per-step", "2", "--sft-epochs", "0", "--max-tokens", "24", "--max-turns", "2",
        "--tool-choice", "required", "--eval-scenarios", "2", "--eval-samples", "1",
        "--val-fraction", "0.1", "--base-model", "tiny",
    ]  # fmt: skip
    return run_until(cmd, ROOT, interrupt_after)


def test_ctrl_c_at_any_point_then_the_same_command_gives_the_uninterrupted_report(
    tmp_path: Path,
) -> None:
    for point in ("tools from", "RL step 1:"):  # during the untrained evaluation; in step 2
        cut = _run(tmp_path, point)
        if cut.returncode == 0:
            continue  # it finished before the signal: nothing to resume
        assert cut.returncode == 130, cut.stderr[-3000:]
        assert "run the same command to resume" in cut.stdout
        assert "Traceback" not in cut.stderr and "Event loop is closed" not in cut.stderr
    done = _run(tmp_path, None)
    assert done.returncode == 0, done.stderr[-3000:]
    (folder,) = (tmp_path / "mcp" / "models").iterdir()
    report = json.loads((folder / "report.json").read_text())
    assert [(e["step"], e["rl_step"]) for e in report["evaluations"]] == [(0, 0), (1, 1), (2, 2)]
    assert [(r["step"], r["rl_step"]) for r in report["rows"]] == [(0, 0), (1, 1), (2, 2)]
    assert report["val_reward_untrained"] == report["rows"][0]["val_reward"]
    assert sorted(p.name for p in (folder / "checkpoints").iterdir())[-1] == "0002"
    # killed during the last evaluation (its journal line never written): the same
    # command evaluates step 2 again, labelled as such, and trains nothing more
    journal = folder / "evaluations.jsonl"
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])  # a torn last line
    again = _run(tmp_path, None)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "RL step 2: held-out" in again.stdout
    report = json.loads((folder / "report.json").read_text())
    assert [(e["step"], e["rl_step"]) for e in report["evaluations"]] == [(0, 0), (1, 1), (2, 2)]
    assert sorted(p.name for p in (folder / "checkpoints").iterdir())[-1] == "0002"


async def test_the_seed_seeds_the_lora_initialisation_so_seeds_vary_the_warm_start(
    tmp_path: Path,
) -> None:
    """The bundled scenarios carry their own split, and the warm start trains them in a
    fixed order: only the seed's LoRA initialisation makes two seeds' warm starts differ."""
    from safetensors.torch import load_file

    adapters = []
    for seed in (1, 2):
        cfg = _cfg(tmp_path / str(seed), steps=0, sft_epochs=1, eval_samples=0, seed=seed)
        report = await train(
            SERVER, cfg, scenarios=SCENARIOS, reward="examples.mcp_server.tasks:score",
            log=lambda _: None,
        )  # fmt: skip
        (adapter,) = (Path(report.folder) / "checkpoints").glob("*/adapter_model.safetensors")
        adapters.append(load_file(adapter))
    assert adapters[0].keys() == adapters[1].keys()
    assert any(not adapters[0][k].equal(adapters[1][k]) for k in adapters[0])
