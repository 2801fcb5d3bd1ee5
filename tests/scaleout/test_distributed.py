"""The data-parallel trainer on the tiny model (gloo, CPU): W=2 ranks against one process,
with the whole model on each rank and sharded (FSDP).

Two ranks must make the single-process update: the same loss, grad norm and metrics, and
adapter weights equal within MAX_WEIGHT_DIFF after two steps (the first moves only the
LoRA B matrices, which start at zero; the second moves A too). A rank killed mid-step
fails the step whole, leaves no process, and a new trainer from the last checkpoint trains
on. FSDP ranks make the same update within MAX_FSDP_WEIGHT_DIFF, hold half the model each,
run with an idle rank, and write a checkpoint a plain trainer loads. The sharding is
checked without processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

import art_langgraph as art
from art_langgraph.errors import TrainerRankError, UsageError
from art_langgraph.scaleout.distributed import DistributedTrainer, _placement, shard
from art_langgraph.training.base import Trainer
from art_langgraph.training.config import ModelConfig, TrainConfig
from art_langgraph.training.tensorize import TrainSequence
from art_langgraph.training.trainer import LoRATrainer
from tests.backend.rollouts import rollout
from tests.conftest import FP32_TRAINER
from tests.training.test_trainer import LR, make_sequences

MAX_WEIGHT_DIFF = 5e-5
"""Largest |W=2 - W=1| allowed over the adapter's weights after two steps at lr 1e-3 (the
update moves weights by up to 2e-3). Measured on a 2-core CPU: 5.0e-6 (token mean) and
3.1e-6 (sequence mean with KL), where one process against itself with another micro-batch
layout differs by 2.0e-6 and 1.3e-6: only the order of float sums differs (per-rank
packing, the all-reduce), and AdamW's first steps (about lr * sign(g)) magnify that
rounding on the gradient entries near zero. The bound is 10x the worst measured, since
another CPU or a GPU sums in another order, and still 40x below the update: ranks that
skip the all-reduce differ by about lr. A gradient scaled wrongly (a mean where the sum
belongs) barely moves AdamW's first steps; the grad-norm checks catch that one."""

MAX_FSDP_WEIGHT_DIFF = 2e-5
"""MAX_WEIGHT_DIFF for FSDP ranks (fsdp=True, each holding half the model) against one
process, the same two steps. Measured on a 2-core CPU: 1.4e-6 (token mean) and 2.1e-6
(sequence mean with KL, micro-batches of 16 tokens), optimizer moments within 8e-9: the
same sources of rounding as without FSDP (each rank sums its own micro-batches, the
reduce-scatter adds the two ranks' sums). 10x the worst measured, as MAX_WEIGHT_DIFF is; a
reduce-scatter that averages (the FSDP default) fails the grad-norm checks instead."""


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def seqs_for(single: LoRATrainer, seed: int) -> list[TrainSequence]:
    """Six sequences of different lengths, off-policy (some ratios clip), varied advantages."""
    seqs = make_sequences(
        single, [14, 9, 12, 7, 16, 10], [1.0, -1.0, 0.5, 2.0, -0.3, -1.5], seed=seed, offset=-0.1
    )
    seqs[2].sampler_logprobs = [x + 0.4 for x in seqs[2].sampler_logprobs]
    return seqs


def test_one_cuda_rank_gets_an_indexed_device() -> None:
    """A rank calls torch.cuda.set_device, which refuses a bare "cuda" (found on an H200:
    one FSDP rank with device="cuda" failed at start). Needs no GPU: one rank is placed
    without counting devices."""
    assert _placement("cuda", 1) == (["cuda:0"], "nccl")
    assert _placement("cuda:1", 1) == (["cuda:1"], "nccl")
    assert _placement("cpu", 2) == (["cpu", "cpu"], "gloo")


@pytest.fixture(scope="module")
def pair(tiny_path: Path) -> Iterator[DistributedTrainer]:
    trainer = DistributedTrainer(str(tiny_path), FP32_TRAINER, ranks=2, device="cpu")
    yield trainer
    pids = trainer.pids
    trainer.close()
    assert not [p for p in pids if alive(p)]  # no rank outlives close()


def fresh(tiny_path: Path, pair: DistributedTrainer, folder: Path) -> LoRATrainer:
    """A new single-process trainer, and the pair reset to its exact state."""
    single = LoRATrainer(str(tiny_path), FP32_TRAINER, device="cpu")
    folder.mkdir()
    single.save(folder)
    pair.load(folder)
    return single


def test_shards_balance_tokens_and_are_deterministic() -> None:
    lengths = [50, 10, 40, 30, 20, 20, 5]
    seqs = [TrainSequence([1] * n, [True] * n, [0.0] * n, 0.0) for n in lengths]
    shares = shard(seqs, 2)
    assert [[len(s) for s in share] for share in shares] == [[50, 20, 20], [10, 40, 30, 5]]
    assert [sum(map(len, share)) for share in shares] == [90, 85]
    assert shard(seqs, 2) == shares
    assert sorted(id(s) for share in shard(seqs, 3) for s in share) == sorted(map(id, seqs))
    assert shard(seqs[:1], 3) == [seqs[:1], [], []]  # more ranks than sequences: some idle


def test_both_trainers_are_the_protocol() -> None:
    assert issubclass(LoRATrainer, Trainer) and issubclass(DistributedTrainer, Trainer)


STEP_CASES = pytest.mark.parametrize(
    "kwargs",
    [{}, {"loss_normalization": "sequence_mean", "beta": 0.1, "micro_batch_tokens": 16}],
    ids=["token_mean", "sequence_mean-kl-small_batches"],
)


@pytest.mark.slow
@STEP_CASES
def test_two_ranks_make_the_single_process_update(
    tiny_path: Path, pair: DistributedTrainer, tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    assert_single_process_update(tiny_path, pair, tmp_path, kwargs, MAX_WEIGHT_DIFF)


def assert_single_process_update(
    tiny_path: Path, pair: DistributedTrainer, tmp_path: Path, kwargs: dict[str, Any], bound: float
) -> None:
    """Two steps of `pair` and of one process from the same state: the same metrics, and
    saved adapters within `bound` of each other."""
    single = fresh(tiny_path, pair, tmp_path / "start")
    config = TrainConfig(learning_rate=LR, **kwargs)
    events: list[tuple[str, dict[str, Any]]] = []
    for step in range(2):
        seqs = seqs_for(single, seed=step)
        one = single.rl_step(seqs, config)
        two = pair.rl_step(seqs, config, lambda stage, info: events.append((stage, info)))
        for key in ("trainable_tokens", "sequences"):
            assert two[key] == one[key], key
        for key in ("loss", "policy_loss", "kl", "clip_fraction", "shared_prefix_tokens"):
            assert two[key] == pytest.approx(one[key], abs=1e-6), key
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
        for key in ("abs_diff_mean", "abs_diff_max", "kl_k3", "ratio_mean"):
            assert two[f"mismatch/{key}"] == pytest.approx(one[f"mismatch/{key}"], abs=1e-6), key
        assert two["trainer_ranks"] == 2
    assert 0 < one["clip_fraction"] < 1  # the clipped branch is exercised
    # Progress: both ranks' micro-batches (their tokens add up to the step's), one optimizer step.
    last = events[len(events) // 2 :]
    assert {info["rank"] for stage, info in last if stage == "micro_batch"} == {0, 1}
    assert sum(i["tokens"] for s, i in last if s == "micro_batch") == two["trainable_tokens"]
    assert [s for s, _ in last].count("optimizer_step") == 1

    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    single.save(tmp_path / "one")
    pair.save(tmp_path / "two")  # checks that both ranks hold the same state first
    for name in ("adapter_model.safetensors", "optimizer.safetensors"):
        a, b = load_file(str(tmp_path / "one" / name)), load_file(str(tmp_path / "two" / name))
        assert a.keys() == b.keys() and a
        assert all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)
        diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
        print(f"{kwargs or 'token_mean'} fsdp={pair.fsdp} {name}: max |W=2 - W=1| = {diff:.3g}")
        if name.startswith("adapter"):
            moved = max(float(b[k].abs().max()) for k in b if "lora_A" not in k)
            assert moved > 20 * bound  # the steps moved the weights 40x the bound
            assert diff <= bound


@pytest.mark.slow
def test_two_ranks_make_the_single_process_sft_step(
    tiny_path: Path, pair: DistributedTrainer, tmp_path: Path
) -> None:
    single = fresh(tiny_path, pair, tmp_path / "start")
    seqs = seqs_for(single, seed=5)
    config = TrainConfig(learning_rate=LR)
    one, two = single.sft_step(seqs, config), pair.sft_step(seqs, config)
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert two["trainable_tokens"] == one["trainable_tokens"]


@pytest.fixture(scope="module")
def fsdp_pair(tiny_path: Path) -> Iterator[DistributedTrainer]:
    trainer = DistributedTrainer(str(tiny_path), FP32_TRAINER, ranks=2, device="cpu", fsdp=True)
    yield trainer
    trainer.close()


@pytest.mark.slow
@STEP_CASES
def test_fsdp_ranks_make_the_single_process_update(
    tiny_path: Path, fsdp_pair: DistributedTrainer, tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    assert_single_process_update(tiny_path, fsdp_pair, tmp_path, kwargs, MAX_FSDP_WEIGHT_DIFF)


@pytest.mark.slow
def test_fsdp_ranks_hold_half_the_model_each(
    pair: DistributedTrainer, fsdp_pair: DistributedTrainer
) -> None:
    assert fsdp_pair.fsdp and not pair.fsdp  # fsdp=None: never on the CPU
    shares = fsdp_pair.param_numel()
    for kind in ("base", "lora"):
        full = shares[0][f"{kind}_full"]
        assert sum(s[f"{kind}_local"] for s in shares.values()) == full  # each element once
        for s in shares.values():  # 1/W each, up to dim-0 padding
            assert full / 2 - 0.01 * full <= s[f"{kind}_local"] <= full / 2 + 0.01 * full, kind
    assert all(s["base_local"] == s["base_full"] for s in pair.param_numel().values())


@pytest.mark.slow
def test_fsdp_idle_rank_sft_and_checkpoint_into_one_process(
    tiny_path: Path, fsdp_pair: DistributedTrainer, tmp_path: Path
) -> None:
    """One sequence leaves rank 1 without micro-batches: it runs zero-weight passes (with
    the KL's reference pass) so that its collectives meet rank 0's; the step is still the
    single-process one. The FSDP checkpoint loads into a plain trainer unchanged."""
    single = fresh(tiny_path, fsdp_pair, tmp_path / "start")
    seqs = seqs_for(single, seed=3)
    config = TrainConfig(learning_rate=LR, beta=0.1)
    one, two = single.rl_step(seqs[:1], config), fsdp_pair.rl_step(seqs[:1], config)
    for key in ("loss", "kl", "trainable_tokens"):
        assert two[key] == pytest.approx(one[key], abs=1e-6), key
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    one, two = single.sft_step(seqs, config), fsdp_pair.sft_step(seqs, config)
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)

    sharded, plain, again = tmp_path / "fsdp", tmp_path / "plain", tmp_path / "again"
    for folder in (sharded, plain, again):
        folder.mkdir()
    fsdp_pair.save(sharded)
    single.save(plain)
    loaded = LoRATrainer(str(tiny_path), FP32_TRAINER, device="cpu")
    loaded.load(sharded)
    loaded.save(again)  # the plain trainer holds exactly what the FSDP ranks wrote
    assert sorted(p.name for p in sharded.iterdir()) == sorted(p.name for p in plain.iterdir())
    for name in ("adapter_config.json", "optimizer.json"):
        a, b = (json.loads((folder / name).read_text()) for folder in (sharded, plain))
        if "target_modules" in a:  # peft writes a set, in each process's hash order
            a["target_modules"], b["target_modules"] = (
                set(a["target_modules"]),
                set(b["target_modules"]),
            )
        assert a == b, name
    for name in ("adapter_model.safetensors", "optimizer.safetensors"):
        a, b = load_file(str(sharded / name)), load_file(str(again / name))
        assert a.keys() == load_file(str(plain / name)).keys() == b.keys()
        assert all(bool((a[k] == b[k]).all()) for k in a), name
    m = loaded.rl_step(seqs, config)  # and trains on from it as the ranks do
    assert m["grad_norm"] == pytest.approx(fsdp_pair.rl_step(seqs, config)["grad_norm"], rel=1e-5)


@pytest.mark.slow
def test_a_killed_rank_fails_the_step_whole_and_a_new_trainer_goes_on(
    tiny_path: Path, tmp_path: Path
) -> None:
    trainer = DistributedTrainer(str(tiny_path), FP32_TRAINER, ranks=2, device="cpu")
    single = LoRATrainer(str(tiny_path), FP32_TRAINER, device="cpu")
    config = TrainConfig(learning_rate=LR)
    trainer.rl_step(seqs_for(single, seed=0), config)
    saved = tmp_path / "step1"
    saved.mkdir()
    trainer.save(saved)
    pids = trainer.pids

    def kill_rank_1(stage: str, info: dict[str, Any]) -> None:
        if stage == "micro_batch" and alive(pids[1]):
            os.kill(pids[1], signal.SIGKILL)
            while alive(pids[1]):  # dead before the parent reads on (it may have finished)
                time.sleep(0.01)

    t0 = time.monotonic()
    with pytest.raises(TrainerRankError, match=r"rank 1 exited with code -9 during rl_step") as e:
        trainer.rl_step(seqs_for(single, seed=1), config, kill_rank_1)
    assert e.value.rank == 1 and e.value.exit_code == -signal.SIGKILL
    assert time.monotonic() - t0 < 30  # found at once, not at a collective's timeout
    assert not [p for p in pids if alive(p)]  # rank 0 too: it may hold half a step
    with pytest.raises(UsageError, match="closed"):
        trainer.rl_step(seqs_for(single, seed=1), config)

    # What a backend does next: a new trainer from the last checkpoint, and the step again.
    again = DistributedTrainer(str(tiny_path), FP32_TRAINER, ranks=2, device="cpu")
    try:
        again.load(saved)
        single.load(saved)
        seqs = seqs_for(single, seed=1)
        m = again.rl_step(seqs, config)
        assert m["grad_norm"] == pytest.approx(single.rl_step(seqs, config)["grad_norm"], rel=1e-5)
    finally:
        again.close()


@pytest.mark.slow
def test_ranks_exit_when_their_parent_is_killed(tiny_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from art_langgraph.training.config import ModelConfig\n"
        "from art_langgraph.scaleout.distributed import DistributedTrainer\n"
        f"t = DistributedTrainer({str(tiny_path)!r}, ModelConfig(), ranks=2, device='cpu')\n"
        "print(*t.pids, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        parent.kill()  # SIGKILL: no atexit, no finalizer runs
        parent.wait()
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if alive(p)]
    finally:
        parent.kill()


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [None, True], ids=["auto", "fsdp"])
async def test_local_backend_trains_on_two_ranks(tmp_path: Path, fsdp: bool | None) -> None:
    from tests.backend.test_local_backend import _groups, _model

    async with art.LocalBackend(
        path=tmp_path, trainer=art.TrainerChoice(ranks=2, fsdp=fsdp)
    ) as backend:
        model = await _model(backend, "dp")
        result = await model.train(await _groups(model), art.TrainConfig(learning_rate=2e-3))
        assert result.step == 1 and result.metrics["trainer_ranks"] == 2
        assert result.metrics["grad_norm"] > 0
        run = backend._runs["dp"]
        assert isinstance(run.trainer, DistributedTrainer)
        assert run.trainer.fsdp is bool(fsdp)  # auto: off on the CPU
        after = await rollout(model, "hello")  # the gathered checkpoint serves
        assert after.calls[0].model == "dp@1"
        pids = run.trainer.pids
    assert not [p for p in pids if alive(p)]  # close() stopped the ranks
    assert (tmp_path / "tests" / "models" / "dp" / "checkpoints" / "0001").is_dir()


def test_fsdp_turns_on_when_the_base_takes_over_40_percent_of_a_cuda_device(
    tiny_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from art_langgraph.scaleout.rank import _fsdp_needed

    config = ModelConfig()  # bfloat16 on CUDA: 650k parameters, 1.3 MB
    bytes_ = 2 * LoRATrainer(str(tiny_path), config, device="cpu").param_numel()["base_full"]
    for total, want in ((bytes_ / 0.41, True), (bytes_ / 0.39, False)):  # 41%, 39%
        props = type("Props", (), {"total_memory": int(total)})()
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d, p=props: p)
        assert _fsdp_needed(str(tiny_path), config, "cuda:0") is want
    assert _fsdp_needed(str(tiny_path), config, "cpu") is False


def test_more_ranks_than_cuda_devices_is_refused(tiny_path: Path) -> None:
    with pytest.raises(UsageError, match="need 64 CUDA devices"):
        DistributedTrainer(str(tiny_path), FP32_TRAINER, ranks=64, device="cuda")


def test_the_rendezvous_listens_on_loopback_only(pair: DistributedTrainer) -> None:
    """torch's store would listen on every interface; ours is given a loopback socket."""
    host, port = pair.rendezvous
    assert host == "127.0.0.1"
    listening = [
        line.split()
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if line.split()[3] == "0A"  # LISTEN
    ]
    ours = [fields[1] for fields in listening if int(fields[1].split(":")[1], 16) == port]
    assert ours == ["0100007F:" + f"{port:04X}"]  # 127.0.0.1, and no 0.0.0.0 twin
