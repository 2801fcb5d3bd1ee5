"""Data-parallel ranks on CUDA (marker `gpu`: skipped without the CUDA devices each needs).

W=2 NCCL ranks (one GPU each) against one process on the same steps, fp32 weights so the
comparison is the CPU test's. Run on lent H200s (docs/benchmarks.md, GPU paths): the
two-rank test skipped there (one GPU); the one-rank FSDP test found the unindexed-device
bug and then one in its helper, both fixed, and passed on the second lease.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from art_langgraph.scaleout.distributed import DistributedTrainer
from art_langgraph.training.config import ModelConfig, TrainConfig
from art_langgraph.training.trainer import LoRATrainer
from tests.scaleout.test_distributed import seqs_for
from tests.training.test_trainer import LR

pytestmark = pytest.mark.gpu


def _need(gpus: int) -> None:
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} CUDA devices")


def test_two_nccl_ranks_make_the_single_process_update(tiny_path: Path) -> None:
    _need(2)
    config = ModelConfig(dtype="float32")
    single = LoRATrainer(str(tiny_path), config, device="cuda:0")
    pair = DistributedTrainer(str(tiny_path), config, ranks=2, device="cuda")
    try:
        assert pair.backend == "nccl" and pair.devices == ["cuda:0", "cuda:1"]
        train = TrainConfig(learning_rate=LR)
        for step in range(2):
            seqs = seqs_for(single, seed=step)
            one = single.rl_step(seqs, train)
            two = pair.rl_step(seqs, train)
            assert two["trainable_tokens"] == one["trainable_tokens"]
            assert two["loss"] == pytest.approx(one["loss"], abs=1e-5)
            assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    finally:
        pair.close()


def test_one_fsdp_rank_on_a_gpu_makes_the_single_process_update(
    tiny_path: Path, tmp_path: Path
) -> None:
    """FSDP over NCCL on the one GPU a lent machine has: the sharding, the CUDA all-reduces
    and the gathered checkpoint, which a plain trainer loads."""
    _need(1)
    config = ModelConfig(dtype="float32")
    single = LoRATrainer(str(tiny_path), config, device="cuda:0")
    sharded = DistributedTrainer(str(tiny_path), config, ranks=1, device="cuda", fsdp=True)
    try:
        assert sharded.backend == "nccl"
        train = TrainConfig(learning_rate=LR)
        for step in range(2):
            seqs = seqs_for(single, seed=step)
            one = single.rl_step(seqs, train)
            two = sharded.rl_step(seqs, train)
            assert two["loss"] == pytest.approx(one["loss"], abs=1e-5)
            assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
        sharded.save(tmp_path)
    finally:
        sharded.close()
    plain = LoRATrainer(str(tiny_path), config, device="cuda:0")
    plain.load(tmp_path)
    assert plain.rl_step(seqs_for(single, seed=2), train)["loss"] == pytest.approx(
        single.rl_step(seqs_for(single, seed=2), train)["loss"], abs=1e-5
    )
