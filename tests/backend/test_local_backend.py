"""LocalBackend end to end: real engine, real server, real trainer, files on disk."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import art_langgraph as art
from tests.backend.rollouts import rollout
from tests.conftest import FP32

LR = art.TrainConfig(learning_rate=2e-3)


@pytest.fixture(scope="module")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    # float32 on every host: a test here checks the trainer's logprobs match the sampler's
    # to 1e-4 (tests/conftest.py FP32)
    async with art.LocalBackend(
        path=tmp_path_factory.mktemp("art"), engine=art.EngineChoice(config=FP32)
    ) as b:
        yield b


async def _model(backend: art.LocalBackend, name: str, **config: object) -> art.TrainableModel:
    model = art.TrainableModel(
        name=name, project="tests", base_model="tiny", training=art.ModelConfig(**config)
    )
    await model.register(backend)
    return model


async def _groups(
    model: art.Model, n_groups: int = 2, size: int = 4, **kw: object
) -> list[art.TrajectoryGroup]:
    trajs = await asyncio.gather(
        *(rollout(model, f"Say a number word {i}", **kw) for i in range(n_groups * size))
    )
    for i, t in enumerate(trajs):
        t.reward = float(i % 3)  # varied rewards in every group, so every group trains
    return [art.TrajectoryGroup(trajs[i * size : (i + 1) * size]) for i in range(n_groups)]


async def test_train_step_swaps_the_adapter_into_serving(backend: art.LocalBackend) -> None:
    model = await _model(backend, "swap")
    assert await model.get_step() == 0
    before = await rollout(model, "hello")
    assert before.calls[0].model == "swap@0" and before.calls[0].adapter_step == 0
    result = await model.train(await _groups(model), LR)
    assert result.step == 1 and await model.get_step() == 1
    m = result.metrics
    assert m["groups"] == 2 and m["zero_variance_groups"] == 0 and m["trajectories"] == 8
    assert (
        m["grad_norm"] > 0 and m["mismatch/abs_diff_mean"] < 1e-4
    )  # token-exact: same ids, same weights
    after = await rollout(model, "hello")  # the very next request
    assert after.calls[0].model == "swap@1" and after.calls[0].adapter_step == 1
    pinned = await rollout(model, "hello", step=0)
    assert pinned.calls[0].model == "swap@0"
    root = backend.path / "tests" / "models" / "swap"
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == ["0001"]
    files = {p.name for p in (root / "checkpoints" / "0001").iterdir()}
    assert {
        "adapter_model.safetensors",
        "adapter_config.json",
        "optimizer.safetensors",
        "checkpoint.json",
    } <= files
    assert not [f for f in files if f.endswith((".pt", ".bin", ".pkl"))]
    group_file = root / "trajectories" / "train" / "0001.jsonl"
    saved = art.read_groups(group_file)
    assert len(saved) == 2 and saved[0].trajectories[0].calls[0].completion_token_ids
    assert art.read_jsonl(group_file, kind=art.TrajectoryGroup) == saved
    with pytest.raises(art.UsageError, match=r"holds TrajectoryGroups.*read_groups"):
        art.read_jsonl(group_file)  # the default kind is Trajectory: the error says what to do
    history = [json.loads(x) for x in (root / "history.jsonl").read_text().splitlines()]
    assert history[-1]["step"] == 1 and history[-1]["split"] == "train"


async def test_nothing_trainable_still_advances_and_says_why(backend: art.LocalBackend) -> None:
    model = await _model(backend, "flat")
    groups = await _groups(model)
    for g in groups:
        for t in g:
            t.reward = 1.0  # equal rewards: no signal
    groups.append(art.TrajectoryGroup([]))
    result = await model.train(groups, LR)
    assert result.step == 1
    m = result.metrics
    assert m["nothing_trainable"] == 1 and m["zero_variance_groups"] == 2 and m["empty_groups"] == 1
    assert (await rollout(model, "x")).calls[0].model == "flat@1"


async def test_bad_groups_are_refused_before_anything_is_saved(backend: art.LocalBackend) -> None:
    model = await _model(backend, "bad")
    with pytest.raises(art.UsageError, match="got no groups"):
        await model.train([], LR)  # no step of nothing
    assert await model.get_step() == 0

    async def pending() -> art.Trajectory:
        return art.Trajectory()

    coro = pending()
    with pytest.raises(art.UsageError, match="unfinished"):
        await model.train([art.TrajectoryGroup([coro])], LR)
    await coro
    with pytest.raises(art.UsageError, match="not a TrajectoryGroup"):
        await model.train([[art.Trajectory()]], LR)  # type: ignore[list-item]
    with pytest.raises(art.NonFiniteRewardError):
        art.Trajectory(reward=float("nan"))
    no_ids = art.Trajectory(
        calls=[
            art.LLMCall(
                messages=[{"role": "user", "content": "x"}],
                response_message={"role": "assistant", "content": "y"},
            )
        ],
        reward=1.0,
    )
    group = art.TrajectoryGroup([no_ids, art.Trajectory(calls=no_ids.calls, reward=0.0)])
    with pytest.raises(art.UsageError, match="without token ids"):
        await model.train([group], LR)

    def with_ids(prompt: list[int], completion: list[int], lps: list[float]) -> art.Trajectory:
        call = no_ids.calls[0].model_copy(
            update={
                "prompt_token_ids": prompt,
                "completion_token_ids": completion,
                "logprobs": lps,
            }
        )
        return art.Trajectory(calls=[call], reward=1.0)

    vocab = backend.engine.vocab_size
    oov = with_ids([1, 2], [vocab + 5], [-1.0])
    short = with_ids([1, 2], [3, 4], [-1.0, -1.0])
    short.calls[0].logprobs = [-1.0]  # changed after the record was checked
    for bad, needle in ((oov, f"token id {vocab + 5} is outside"), (short, "1 logprobs for 2")):
        ok = with_ids([1, 2], [3], [-1.0])
        ok.reward = 0.0
        with pytest.raises(art.UsageError, match=f"trajectory '{bad.id}', call .*{needle}"):
            await model.train([art.TrajectoryGroup([bad, ok])], LR)
    assert await model.get_step() == 0
    assert not list((backend.path / "tests" / "models" / "bad" / "checkpoints").iterdir())


async def test_requests_wait_while_a_step_trains(backend: art.LocalBackend) -> None:
    model = await _model(backend, "wait")
    groups = await _groups(model)
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    def progress(stage: str, info: dict) -> None:
        if stage == "micro_batch":
            loop.call_soon_threadsafe(started.set)

    train = asyncio.create_task(model.train(groups, LR, progress=progress))
    await started.wait()
    during = await rollout(model, "during")  # sent while training: waits, then served by step 1
    pinned = await rollout(model, "pinned", step=0)
    await train
    assert during.calls[0].model == "wait@1"
    assert pinned.calls[0].model == "wait@0"


async def test_serving_continues_during_training_when_asked(backend: art.LocalBackend) -> None:
    model = await _model(backend, "live", serve_during_training=True)
    groups = await _groups(model)
    release = asyncio.Event()
    seen: list[str] = []
    loop = asyncio.get_running_loop()

    def progress(stage: str, info: dict) -> None:
        if stage == "micro_batch":
            fut = asyncio.run_coroutine_threadsafe(rollout(model, "during"), loop)
            seen.append(fut.result(timeout=30).calls[0].model or "")
            loop.call_soon_threadsafe(release.set)

    await model.train(groups, LR, progress=progress)
    assert release.is_set() and seen == ["live@0"]
    # a group served two steps back is too stale for max_staleness=0
    await model.train(await _groups(model), LR)
    stale = groups  # served by step 0; the next step is 3
    result = await model.train(stale, art.TrainConfig(learning_rate=2e-3, max_staleness=0))
    assert result.metrics["stale_groups"] == 2 and result.metrics["nothing_trainable"] == 1


async def test_log_and_delete_checkpoints_keep_latest_and_best(backend: art.LocalBackend) -> None:
    model = await _model(backend, "keep")
    for reward in (0.2, 0.9, 0.1, 0.3):
        await model.train(await _groups(model), LR)
        await model.log([art.TrajectoryGroup([art.Trajectory(reward=reward)])], split="val")
    deleted = await model.delete_checkpoints("val/reward", keep_last=1)
    assert deleted == [1, 3]
    root = backend.path / "tests" / "models" / "keep"
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == ["0002", "0004"]
    assert (root / "trajectories" / "val" / "0002.jsonl").exists()
    assert (await rollout(model, "x", step=2)).calls[0].model == "keep@2"
    with pytest.raises(Exception, match="keep@3"):
        await rollout(model, "x", step=3)


async def test_restart_resumes_at_the_last_complete_step(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path) as b1:
        m1 = await _model(b1, "resume")
        await m1.train(await _groups(m1), LR)
        await m1.train(await _groups(m1), LR)
        greedy1 = await rollout(m1, "fixed prompt", seed=0)
    root = tmp_path / "tests" / "models" / "resume" / "checkpoints"
    # a half-written checkpoint (no checkpoint.json) and a leftover temp folder
    (root / "0003").mkdir()
    (root / "0003" / "adapter_model.safetensors").write_bytes(b"garbage")
    (root / ".tmp-0004-dead").mkdir()
    async with art.LocalBackend(path=tmp_path) as b2:
        m2 = await _model(b2, "resume")
        assert await m2.get_step() == 2
        greedy2 = await rollout(m2, "fixed prompt", seed=0)
        assert greedy2.calls[0].model == "resume@2"
        assert greedy2.calls[0].completion_token_ids == greedy1.calls[0].completion_token_ids
        names = sorted(p.name for p in root.iterdir())
        assert (
            names[:2] == ["0001", "0002"]
            and names[2].startswith("0003.invalid-")
            and len(names) == 3
        )
        result = await m2.train(await _groups(m2), LR)
        assert result.step == 3


async def test_sft_warm_start_teaches_a_format(backend: art.LocalBackend) -> None:
    model = await _model(backend, "sft")
    convos = [
        [
            {"role": "user", "content": f"Give me a number {i}"},
            {"role": "assistant", "content": "seven"},
        ]
        for i in range(16)
    ]
    result = await model.train_sft(
        convos, art.TrainConfig(learning_rate=5e-3), epochs=8, batch_size=8
    )
    assert (
        result.step == 1 and result.metrics["sft_loss_last"] < result.metrics["sft_loss_first"] / 2
    )
    outs = await asyncio.gather(
        *(rollout(model, f"Give me a number {i}", max_tokens=4) for i in range(100, 108))
    )
    assert sum(t.reward for t in outs) >= 6


async def test_sft_stop_loss_ends_the_warm_start_after_an_epoch(
    backend: art.LocalBackend,
) -> None:
    """`stop_loss` ends the warm start after the first epoch from the second on whose tail
    loss is at or under it; without it every epoch runs; the metrics give each epoch's
    losses, its share of demonstrations with no token in doubt, and the time."""
    convos = [
        [{"role": "user", "content": f"Say {i}"}, {"role": "assistant", "content": "ok"}]
        for i in range(16)
    ]
    lr = art.TrainConfig(learning_rate=5e-3)
    every = (await (await _model(backend, "sft-all")).train_sft(convos, lr, epochs=3)).metrics
    assert every["sft_epochs"] == 3 and every["sft_steps"] == 6 and every["sft_seconds"] > 0
    assert every["sft_epoch3_tail_loss"] < every["sft_epoch1_loss"]
    assert all(0 <= every[f"sft_epoch{k}_tail_sure"] <= 1 for k in (1, 2, 3))
    model = await _model(backend, "sft-stop")
    early = (await model.train_sft(convos, lr, epochs=3, stop_loss=1e9)).metrics
    assert early["sft_epochs"] == 2 and early["sft_steps"] == 4 and "sft_epoch3_loss" not in early
    for bad in (float("nan"), -0.1):
        with pytest.raises(art.UsageError, match="stop_loss"):
            await model.train_sft(convos, lr, stop_loss=bad)
    assert await model.get_step() == 1  # the refused calls trained nothing


async def test_inference_only_model_serves_the_base(backend: art.LocalBackend) -> None:
    judge = art.Model(name="judge", project="tests", base_model="tiny")
    await judge.register(backend)
    t = await rollout(judge, "hi")
    assert t.calls[0].model == "judge@0" and await judge.get_step() == 0
    with pytest.raises(art.UsageError, match="one LocalBackend per base model"):
        await art.Model(
            name="other", project="tests", base_model="Qwen/Qwen2.5-0.5B-Instruct"
        ).register(backend)


async def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path) as b1:
        m1 = await _model(b1, "fallback")
        await m1.train(await _groups(m1), LR)
        await m1.train(await _groups(m1), LR)
    ckpts = tmp_path / "tests" / "models" / "fallback" / "checkpoints"
    (ckpts / "0002" / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    async with art.LocalBackend(path=tmp_path) as b2:
        m2 = await _model(b2, "fallback")
        assert await m2.get_step() == 1
        assert (await rollout(m2, "x")).calls[0].model == "fallback@1"
        aside = [p for p in ckpts.iterdir() if p.name.startswith("0002.invalid-")]
        assert (
            len(aside) == 1 and (aside[0] / "adapter_model.safetensors").exists()
        )  # kept, not deleted
    async with art.LocalBackend(path=tmp_path) as b3:
        wrong = art.TrainableModel(
            name="fallback", project="tests", base_model=str(b3.path / "elsewhere")
        )
        with pytest.raises(art.UsageError, match="was trained on 'tiny'"):
            await wrong.register(b3)


def _adam_step(checkpoint: Path) -> float:
    from safetensors.torch import load_file

    return float(load_file(str(checkpoint / "optimizer.safetensors"))["0.step"])


async def test_a_failed_step_changes_nothing_in_memory_or_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_langgraph.backend.checkpoints import CheckpointStore

    async with art.LocalBackend(path=tmp_path) as b:
        m = await _model(b, "victim")
        await m.train(await _groups(m), LR)
        ckpts = tmp_path / "tests" / "models" / "victim" / "checkpoints"
        assert _adam_step(ckpts / "0001") == 1.0
        real_write = CheckpointStore.write
        fails = {"left": 3}

        def flaky_write(self: CheckpointStore, step: int, fill: object, meta: object) -> Path:
            if fails["left"]:
                fails["left"] -= 1
                raise OSError(28, "No space left on device")  # after the optimizer step
            return real_write(self, step, fill, meta)  # type: ignore[arg-type]

        monkeypatch.setattr(CheckpointStore, "write", flaky_write)
        groups = await _groups(m)
        for _ in range(3):
            with pytest.raises(OSError, match="No space left"):
                await m.train(groups, LR)
            assert await m.get_step() == 1
        assert (await rollout(m, "x")).calls[0].model == "victim@1"  # still served, unpaused
        await m.train(groups, LR)
        assert await m.get_step() == 2
        # one optimizer step on top of checkpoint 1, not four
        assert _adam_step(ckpts / "0002") == 2.0


async def test_a_corrupt_optimizer_state_is_set_aside_not_silently_reset(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path) as b1:
        m1 = await _model(b1, "victim")
        await m1.train(await _groups(m1), LR)
        await m1.train(await _groups(m1), LR)
    ckpts = tmp_path / "tests" / "models" / "victim" / "checkpoints"
    (ckpts / "0002" / "optimizer.safetensors").write_bytes(b"\x00" * 64)
    async with art.LocalBackend(path=tmp_path) as b2:
        m2 = await _model(b2, "victim")
        assert await m2.get_step() == 2  # the adapter itself still loads and serves
        result = await m2.train(await _groups(m2), LR)
        # training resumed from checkpoint 1's optimizer, and the bad checkpoint is kept aside
        assert result.step == 2 and _adam_step(ckpts / "0002") == 2.0
        (aside,) = [p for p in ckpts.iterdir() if p.name.startswith("0002.invalid-")]
        assert "cannot restore the trainer" in (aside / "set_aside.txt").read_text()
        assert (await rollout(m2, "x")).calls[0].model == "victim@2"


async def test_a_stray_file_named_like_the_next_step_is_moved_aside(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path) as b:
        m = await _model(b, "victim")
        await m.train(await _groups(m), LR)
        ckpts = tmp_path / "tests" / "models" / "victim" / "checkpoints"
        (ckpts / "0002").write_text("left here by someone")
        assert (await m.train(await _groups(m), LR)).step == 2
        assert (ckpts / "0002" / "checkpoint.json").is_file()
        (stray,) = [p for p in ckpts.iterdir() if p.name.startswith("0002.invalid-")]
        assert stray.read_text() == "left here by someone"


async def test_a_history_line_lost_to_a_kill_is_restored_from_the_checkpoint(
    tmp_path: Path,
) -> None:
    async with art.LocalBackend(path=tmp_path) as b1:
        m1 = await _model(b1, "victim")
        await m1.train(await _groups(m1), LR)
    history = tmp_path / "tests" / "models" / "victim" / "history.jsonl"
    lines = history.read_text().splitlines()
    lost = json.loads(lines[-1])
    history.write_text("".join(line + "\n" for line in lines[:-1]))  # killed before the append
    async with art.LocalBackend(path=tmp_path) as b2:
        await _model(b2, "victim")
    (back,) = [json.loads(x) for x in history.read_text().splitlines() if '"train"' in x]
    assert back["step"] == 1 and back["recovered"] == 1.0
    assert back["reward"] == pytest.approx(lost["reward"])


async def test_nan_adapter_weights_are_never_served(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    async with art.LocalBackend(path=tmp_path) as b1:
        m1 = await _model(b1, "victim")
        await m1.train(await _groups(m1), LR)
        await m1.train(await _groups(m1), LR)
    file = (
        tmp_path
        / "tests"
        / "models"
        / "victim"
        / "checkpoints"
        / "0002"
        / "adapter_model.safetensors"
    )
    weights = load_file(str(file))
    first = next(iter(weights))
    weights[first] = weights[first] * float("nan")
    save_file(weights, str(file))
    async with art.LocalBackend(path=tmp_path) as b2:
        m2 = await _model(b2, "victim")
        assert await m2.get_step() == 1  # step 2 set aside: NaN weights
        assert (await rollout(m2, "x")).calls[0].model == "victim@1"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"trainer_ranks": 0}, "trainer_ranks must be an integer >= 1"),
        ({"replicas": 0}, "replicas must be an integer >= 1"),
        (
            {"trainer": art.TrainerChoice(fsdp=True)},
            "with trainer_ranks=1 and no ray there is one plain trainer",
        ),
        ({"engine": "gpu"}, "engine must be 'auto', 'torch' or 'vllm'"),
        ({"ray": "local", "engine": "vllm"}, "vLLM replicas are not placed on Ray"),
    ],
)
def test_a_layout_that_cannot_be_built_is_refused_at_once(
    kwargs: dict[str, object], match: str, tmp_path: Path
) -> None:
    with pytest.raises(art.UsageError, match=match):
        art.LocalBackend(path=tmp_path, **kwargs)  # type: ignore[arg-type]


_NEVER_CLOSED = """
import sys
from pathlib import Path

import art_langgraph as art


class Logger:
    def log_trajectories(self, run, step, split, groups): pass
    def log_metrics(self, run, step, split, metrics): pass
    def close(self):
        Path(sys.argv[1]).write_text("flushed")


backend = art.LocalBackend(path=sys.argv[2], loggers=[Logger()])
"""


def test_a_backend_never_closed_still_closes_its_loggers_at_exit(tmp_path: Path) -> None:
    """The README's swap-in (and ART's examples) never close the backend: the process's
    exit still flushes its loggers, once."""
    marker = tmp_path / "closed"
    script = tmp_path / "never_closed.py"
    script.write_text(_NEVER_CLOSED)
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(script), str(marker), str(tmp_path / "art")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert marker.read_text() == "flushed"


async def test_close_closes_the_loggers_once(tmp_path: Path) -> None:
    closed: list[int] = []

    class Logger:
        def log_trajectories(self, *a: object) -> None: ...
        def log_metrics(self, *a: object) -> None: ...
        def close(self) -> None:
            closed.append(1)

    backend = art.LocalBackend(path=tmp_path, loggers=[Logger()])
    await backend.close()
    await backend.close()
    del backend
    gc.collect()
    assert closed == [1]


async def test_a_closed_backend_frees_its_engine_and_weights(tmp_path: Path) -> None:
    # A process that starts and closes backends (a notebook, a sweep, this test suite) must
    # get each one's engine back: FastAPI keeps every endpoint function it has classified in
    # module-level caches, so a route that closed over the engine kept a stopped server's
    # weights and caches alive for good (1.5 GiB on SmolLM2-135M)
    import weakref

    backend = art.LocalBackend(path=tmp_path, engine=art.EngineChoice(config=FP32))
    model = art.TrainableModel(name="freed", project="tests", base_model="tiny")
    await model.register(backend)
    await rollout(model, "Say a number word")  # the server has answered through its routes
    engine = weakref.ref(backend.engine)
    weights = weakref.ref(next(iter(backend.engine.shared_base.tensors.values())))
    await backend.close()
    del backend, model
    gc.collect()
    assert engine() is None and weights() is None
