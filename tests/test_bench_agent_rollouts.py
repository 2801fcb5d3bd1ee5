"""bench.agent_rollouts: each host class's run is saved and tabled under a name of its own."""

from __future__ import annotations

from bench.agent_rollouts import host_name
from bench.readme import BENCHMARKS


def test_each_host_class_has_its_own_result_name_and_an_amx_table() -> None:
    assert host_name({"avx2", "fma"}) == "agent_rollouts"  # the first table's name, kept
    assert host_name({"avx512f", "avx512_bf16"}) == "agent_rollouts_avx512bf16"
    assert host_name({"amx_bf16", "avx512_bf16", "avx512f"}) == "agent_rollouts_amx"
    page = BENCHMARKS.read_text()
    for name in ("agent_rollouts", "agent_rollouts_amx"):
        assert f"<!-- bench:{name}:start -->" in page
