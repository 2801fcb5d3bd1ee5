"""The CI learning test on BFCL: GRPO through the LangGraph swap-in makes SmolLM2-135M call
BFCL's held-out functions better than a run without learning would, in at most 10 minutes.

It runs `python -m examples.bfcl` as a user does, cut to fit CI: seed 0, 4 steps of 8 x 4
rollouts on simple_python and multiple items, and BFCL's checker on the first 30 items of
each of those two categories' held-out sample, greedy, before and after (CI_ARGS). The
headline is the mean greedy rise over the two categories (`calling_mean_greedy_rise`).

Its margin comes from 5 seeds of exactly these arguments, none of them seed 0, and is
checked against 2 shuffled-reward controls (`python -m bench.learning_bfcl --seeds
1,2,3,4,5 --controls 0,1 --tag ci2r --extra "<CI_ARGS>"`, which also pools them;
bench/results/learning_bfcl/bfcl_amx_ci2r.json, docs/results.md#the-ci-learning-test): the
seeds' mean minus 2.33 spreads, the spread being the seeds' sd or, where larger, a run's own
standard error (`bench.learning_bfcl.margin`). Seeds 1-5 rose +0.33, +0.28, +0.28, +0.35 and
+0.25 (mean +0.30 ± 0.04 sd; a run's s.e. 0.058), so MIN_RISE is +0.30 - 2.33 x 0.058 =
+0.165, rounded down to +0.16; both controls rose +0.00, 0.16 below it. Measured at commit
f4516f2 (code hash 4fb22e83e6d0) on an AMX host (CPU flags amx_bf16, avx512_bf16, avx512f,
avx2), where `auto` keeps SmolLM2-135M in float32 as it does on the other host classes, so
the arm computes the same thing there; its time differs: 6.8-8.5 min a run on 2 AMX cores.
The margin before (+0.08, `bfcl_amx_ci2_*.json`) was set on the engine of 6273130, whose runs
took 8.7-12.5 min. This test's own run there (seed 0, `bfcl_amx_ci2rtest_seed0.json`) rose
+0.167 in 7.9 min: it passed by 0.007, 2.3 spreads under the seeds' mean. Since f5990e9 the
example seeds its groups and sampled evaluations from `--seed`, so seed 0 is one fixed draw
of the arm (as far as the engine's logits repeat beside other work); on 1fab276 it rose +0.32
(`bfcl_amx_ci2sr_seed0.json`). The margin's runs were unseeded: seeding changes which draws a
run makes, not their distribution (docs/bfcl.md#seeded).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.readme import results_dir

ROOT = Path(__file__).resolve().parents[2]
CI_ARGS = [
    "--steps", "4", "--train-categories", "simple_python,multiple",
    "--eval-categories", "simple_python,multiple", "--eval-limit", "30", "--eval-modes", "greedy",
]  # fmt: skip
"""The arm's arguments, and its bench runs' (`bench.learning_bfcl --extra`)."""
MIN_RISE = 0.16
"""The least mean greedy rise the arm accepts (the module docstring)."""
RUNS = sorted(results_dir("learning_bfcl").glob("bfcl_amx_ci2r_*[0-9].json"))
"""The runs that set MIN_RISE (seeds) and check it (controls)."""


def test_the_margin_sits_above_every_control_and_came_from_these_arguments() -> None:
    """A margin lowered until a run without learning passes, or arguments changed without
    re-deriving it, fail here before the slow run."""
    from examples.bfcl.app import parser

    want = {
        k: v
        for k, v in vars(parser().parse_args(CI_ARGS)).items()
        if k not in ("seed", "control", "out")
    }
    runs = [json.loads(p.read_text()) for p in RUNS]
    seeds = [r for r in runs if not r["control"]]
    controls = [r for r in runs if r["control"]]
    assert len(seeds) == 5 and len(controls) == 2 and 0 not in {r["args"]["seed"] for r in seeds}
    # a run recorded before an option existed ran at what is now that option's default
    ap = parser()
    for r in runs:
        assert {k: r["args"].get(k, ap.get_default(k)) for k in want} == want
    assert all(r["calling_mean_greedy_rise"] < MIN_RISE for r in controls)


@pytest.mark.slow
@pytest.mark.bfcl
def test_rl_makes_the_real_model_call_bfcls_functions_better(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "examples.bfcl", "--seed", "0", *CI_ARGS, "--out", str(tmp_path)]
    # a hang guard, not a time limit: the arm took 10 min on a fast 2-core host and over
    # 25 on a slow one beside other work (docs/bfcl.md)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=2700)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["args"]["seed"] == 0 and not result["args"]["control"]
    assert set(result["accuracy"]) == {"simple_python/greedy", "multiple/greedy"}
    rise = result["calling_mean_greedy_rise"]
    assert rise >= MIN_RISE, (rise, result["accuracy"], out.stdout[-2000:])
