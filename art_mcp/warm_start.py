"""The SFT warm start before RL, epoch by epoch, ended by how the agent behaves.

A warm start on a task's demonstrations can end early, but its token loss cannot say
when: on the capitals task every epoch's tail loss was 0.00, while held-out success
after two epochs was 0.96 on two seeds and 0.46 on a third, whose agent called the same
tool for every question (docs/benchmarks.md#time-to-rise). So when the demonstrations
are the training scenarios' own, a few whole training entities (`metadata["entity"]`,
else the scenario) are held back from them: the probe. After each epoch but the last
the agent runs the probe's scenarios greedily, as an evaluation does, and the warm
start ends once a `sft_probe_pass` share of them succeed. The held-back scenarios stay in
RL's training set; only the warm start does not see their demonstrations.

Each epoch is one `train_sft` call (one checkpoint; the trainer's optimizer carries
over, so the epochs train as one call's would) and one journal record, so a restarted
run goes on from the epochs its folder holds. Given demonstrations (`--sft`), too few
of them for a probe (`probe_size`), or one epoch: the warm start is one call, ended by
`sft_stop_loss` as before.

`replay` is the warm start carried into RL (`sft_replay`): after each RL step, one SFT
step at RL's rate on a draw of the same demonstrations. A kill between an RL step and its
replay loses that replay, not the RL step (the RL step is committed first).

Left out: a probe of given demonstrations (they name no scenario to run), and of a run
scored by a judge alone (the probe reads the reward function's score; judging a group's
episodes against each other says little of one greedy episode).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import art_langgraph as art
from art_mcp.agent import demonstrations
from art_mcp.config import HarnessConfig
from art_mcp.progress import peak_rss, warm_start_line
from art_mcp.report import append_journal, read_journal
from art_mcp.scenarios import Scenario

KIND = "warm_start"
"""The journal records' kind: one when the warm start begins (epoch 0), then one per epoch."""

PROBE_SHARE = 16
"""At most one demonstration in this many is held back for the probe."""

MIN_PROBE = 4
"""Below this many scenarios a probe says too little to end a warm start on: none is held."""


def probe_size(demonstrations: int, most: int) -> int:
    """How many scenarios the probe holds back from `demonstrations`: `most`, but at most
    one in `PROBE_SHARE`, and none when that is under `MIN_PROBE`."""
    size = min(most, demonstrations // PROBE_SHARE)
    return size if size >= MIN_PROBE else 0


def entity(s: Scenario) -> str:
    """What a scenario asks about: its `metadata["entity"]` when a string, else its id."""
    found = s.metadata.get("entity")
    return found if isinstance(found, str) and found else s.id


def probe_split(
    scenarios: list[Scenario], size: int, seed: int
) -> tuple[list[Scenario], list[Scenario]]:
    """(taught, probe) of the training `scenarios` that carry demonstrations: whole
    entities, drawn in a seeded order, held back until the probe holds at least `size`
    scenarios (none when `size` is 0); the rest, in their order, are taught."""
    shown = [s for s in scenarios if s.demonstration]
    counts = Counter(entity(s) for s in shown)
    names = sorted(counts)
    random.Random(f"probe/{seed}").shuffle(names)
    held: set[str] = set()
    for name in names:
        if sum(counts[n] for n in held) >= size:
            break
        held.add(name)
    return [s for s in shown if entity(s) not in held], [s for s in shown if entity(s) in held]


@dataclass
class Progress:
    """Where a folder's warm start stands, from its journal."""

    begun: bool
    """A record says the warm start began (code that wrote none ran it in one call)."""
    epochs: int
    """Epochs recorded as done."""
    finished: bool
    """A record says it ended (stopped by the probe, or its last epoch done)."""


def progress(journal: list[dict[str, Any]]) -> Progress:
    """The warm start's progress from a run's journal records."""
    records = [r for r in journal if r.get("kind") == KIND]
    return Progress(
        begun=bool(records),
        epochs=max((int(r.get("epoch", 0)) for r in records), default=0),
        finished=any(r.get("done") for r in records),
    )


def sft_config(cfg: HarnessConfig) -> art.TrainConfig:
    """The warm start's `TrainConfig`: its learning rate, matmul dtype and frozen root."""
    return art.TrainConfig(
        learning_rate=cfg.sft_learning_rate,
        sft_compute_dtype=cfg.sft_compute_dtype,
        sft_frozen_root=cfg.sft_frozen_root,
    )


def probe_line(epoch: int, passed: int, size: int, seconds: float, stop: bool) -> str:
    """The log line of a probe: "warm-start probe after epoch 2: 8 of 8 held-back training
    scenarios succeeded greedily in 14 s: the warm start ends"."""
    verdict = "the warm start ends" if stop else "going on"
    return (
        f"warm-start probe after epoch {epoch}: {passed} of {size} held-back training "
        f"scenarios succeeded greedily in {seconds:.0f} s: {verdict}"
    )


async def probed_warm_start(
    model: art.TrainableModel,
    cfg: HarnessConfig,
    folder: Path,
    step: int,
    demos: list[Any],
    probe: list[Scenario],
    epochs: int,
    run_probe: Callable[[list[Scenario]], Awaitable[list[float]]],
    log: Callable[[str], None],
) -> None:
    """The warm start's epochs still to do, one `train_sft` call each; after each but the
    last, the probe (`run_probe`: each scenario's greedy reward), ending the warm start
    once a `cfg.sft_probe_pass` share of them reach `cfg.success_reward`. The model's
    `step` counts the epochs done (each is one checkpoint, from step 0), so an epoch whose
    record a kill lost is probed on resuming, not trained again."""
    state = progress(read_journal(folder))
    if state.finished:
        return
    if not state.begun:
        record = {"epoch": 0, "demonstrations": len(demos), "probe": [s.id for s in probe]}
        append_journal(folder, KIND, record)

    async def after(epoch: int, metrics: dict[str, float]) -> bool:
        record: dict[str, Any] = {"epoch": epoch, "done": epoch >= epochs}
        record.update(
            seconds=metrics.get("sft_seconds"), tail_loss=metrics.get("sft_epoch1_tail_loss")
        )
        if epoch < epochs:
            tick = time.perf_counter()
            passed = sum(r >= cfg.success_reward for r in await run_probe(probe))
            record["done"] = passed >= cfg.sft_probe_pass * len(probe)
            took = time.perf_counter() - tick
            log(probe_line(epoch, passed, len(probe), took, record["done"]))
            record.update(probe_passed=passed, probe_size=len(probe), probe_seconds=took)
        append_journal(folder, KIND, record)
        return bool(record["done"])

    if step > state.epochs and await after(step, {}):  # its checkpoint saved, its record lost
        return
    for epoch in range(step + 1, epochs + 1):
        res = await model.train_sft(demos, sft_config(cfg), epochs=1, batch_size=8)
        log(warm_start_line(len(demos), epochs, res.metrics, epoch=epoch) + peak_rss())
        if await after(epoch, res.metrics):
            return


async def warm_start(
    model: art.TrainableModel,
    cfg: HarnessConfig,
    folder: Path,
    step: int,
    train_set: list[Scenario],
    sft: list[Any] | str | Path | None,
    tools: list[Any],
    run_probe: Callable[[list[Scenario]], Awaitable[list[float]]] | None,
    log: Callable[[str], None],
) -> None:
    """The warm start before RL on the demonstrations (`agent.demonstrations`: the given
    `sft` ones, else `train_set`'s scenarios' own, rendered with `tools`). With the
    scenarios' own, more than one epoch and a probe (`probe_size`; `run_probe` None: no
    reward function to read it), `probed_warm_start`; else one `train_sft` call ended by
    `cfg.sft_stop_loss` (none when there is nothing to teach). Nothing when the model is
    past `step` 0 and the journal says no warm start began (it was done in one call, or
    is not this run's)."""
    if step > 0 and not progress(read_journal(folder)).begun:
        return
    demos = demonstrations(sft, train_set, tools)
    epochs = cfg.warm_start_epochs(len(demos))
    size = probe_size(len(demos), cfg.sft_probe)
    if sft is None and run_probe is not None and epochs > 1 and size:
        taught, probe = probe_split(train_set, size, cfg.seed)
        taught_demos = demonstrations(None, taught, tools)
        await probed_warm_start(
            model, cfg, folder, step, taught_demos, probe, epochs, run_probe, log
        )
    elif epochs > 0:
        res = await model.train_sft(
            demos, sft_config(cfg), epochs=epochs, batch_size=8, stop_loss=cfg.sft_stop_loss
        )
        log(warm_start_line(len(demos), epochs, res.metrics) + peak_rss())


async def replay(
    model: art.TrainableModel, cfg: HarnessConfig, demos: list[Any], index: int
) -> art.TrainResult | None:
    """RL step `index + 1`'s replay (`cfg.sft_replay`): one SFT step at RL's learning rate on
    a seeded draw of `demos`; None when it is off or there are no demonstrations."""
    if not cfg.sft_replay or not demos:
        return None
    draw = random.Random(f"{cfg.seed}/replay/{index}").sample(
        demos, min(cfg.sft_replay, len(demos))
    )
    config = sft_config(cfg).model_copy(update={"learning_rate": cfg.lr()})
    return await model.train_sft(draw, config, epochs=1, batch_size=len(draw))
