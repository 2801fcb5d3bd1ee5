"""bench.turn_rules, bench.dynamic_sampling, bench.rl_lr, bench.repeat_penalty and
bench.repeat_credit: their arms are flags `art-mcp train` takes, and bench.sweep's table
pools seeds."""

from __future__ import annotations

from art_mcp.cli import _parser
from art_mcp.config import HarnessConfig
from bench.sweep import table
from bench.turn_rules import ARMS


def _train_config(flags: list[str]) -> HarnessConfig:
    """The harness config `art-mcp train` builds from `flags` (and a task's required ones)."""
    base = ["train", "--server", "python -m x", "--scenarios", "s.jsonl", "--reward", "m:f"]
    args = _parser().parse_args([*base, *flags])
    return HarnessConfig(**{k: getattr(args, k) for k in HarnessConfig.model_fields})


def test_every_arm_is_flags_art_mcp_train_takes() -> None:
    for arm, flags in ARMS.items():
        cfg = _train_config(flags)
        assert cfg.max_turns == int(flags[1]) and cfg.final_answer_turn, arm
        assert cfg.after_repeat == flags[-1], arm


def test_the_table_pools_seeds_per_task_and_arm() -> None:
    def row(task: str, arm: str, before: float, after: float, **more: object) -> dict:
        return dict(task=task, arm=arm, sampled_before=before, sampled_after=after,
                    greedy_after=after, wall_s=600.0, **more)  # fmt: skip

    def hop(rise: float) -> dict:
        return {"one-hop": {"sampled": {"rise": -rise}}, "two-hop": {"sampled": {"rise": rise}}}

    text = table(
        [
            row(
                "org",
                "now",
                0.1,
                0.3,
                groups=[8, 8],
                zero_variance_groups=[6, 2],
                slices=hop(0.2),
                calls={"all": {"repeated_before": 0.4, "repeated_after": 0.2}},
            ),
            row(
                "org",
                "now",
                0.1,
                0.5,
                groups=[8, 12],
                zero_variance_groups=[4, 4],
                slices=hop(-0.05),
                calls={"all": {"repeated_before": 0.2, "repeated_after": 0.0}},
            ),
            row("org", "turns6", 0.1, 0.2),  # a run that did not record its groups
            {**row("org", "stopped", 0.5, 0.1), "wall_s": None},  # stopped before its end
        ]
    )
    assert "| org | stopped | 1 | -0.40 | - | - | 0.10 | 0.10 | - | - | - |" in text
    assert (
        "| org | now | 2 | +0.30 ± 0.14 | -0.20, +0.05 | +0.20, -0.05 | 0.40 | 0.40 | 10 / 18 "
        "| 0.30 -> 0.10 | 10.0 |" in text
    )
    assert "| org | turns6 | 1 | +0.10 | - | - | 0.20 | 0.20 | - | - | 10.0 |" in text


def test_every_dynamic_sampling_arm_is_flags_art_mcp_train_takes() -> None:
    from bench.dynamic_sampling import ARMS as REFILL_ARMS

    for arm, flags in REFILL_ARMS.items():
        cfg = _train_config(flags)
        assert cfg.refill_groups == (int(flags[1]) if flags else 0), arm


def test_every_rl_lr_arm_sets_one_thing() -> None:
    from bench.rl_lr import ARMS as LR_ARMS

    default = _train_config([])
    for arm, flags in LR_ARMS.items():
        cfg = _train_config(flags)
        if arm == "g4x8":
            assert (cfg.groups_per_step, cfg.group_size) == (4, 8)
            assert cfg.model_copy(update={"groups_per_step": 8, "group_size": 4}) == default
            continue
        if arm == "seqmean":
            assert cfg.rl_config().loss_normalization == "sequence_mean"
            assert cfg.model_copy(update={"loss_normalization": "token_mean"}) == default
            continue
        if arm in ("batch", "batchpos"):
            want = {"batch": "batch_baseline", "batchpos": "batch_baseline_positive"}[arm]
            assert cfg.rl_config().flat_groups == want
            assert cfg.model_copy(update={"flat_groups": "skip"}) == default
            continue
        if arm == "replay8":
            assert cfg.sft_replay == 8
            assert cfg.model_copy(update={"sft_replay": 0}) == default
            continue
        if arm == "e2":
            assert cfg.warm_start_epochs(64) == 2 != default.warm_start_epochs(64)
            assert cfg.model_copy(update={"sft_epochs": None}) == default
            continue
        if arm == "share":
            assert cfg.signal_share_scale and cfg.rl_config().signal_share_scale
            assert cfg.model_copy(update={"signal_share_scale": False}) == default
            continue
        assert cfg.lr() == float(arm.removeprefix("lr")), arm
        assert cfg.model_copy(update={"learning_rate": None}) == default, arm


def test_every_repeat_penalty_arm_sets_the_penalty_alone() -> None:
    from bench.repeat_penalty import ARMS as PENALTY_ARMS

    default = _train_config([])
    for arm, flags in PENALTY_ARMS.items():
        cfg = _train_config(flags)
        assert cfg.repeat_penalty == float(flags[1]), arm
        assert cfg.model_copy(update={"repeat_penalty": default.repeat_penalty}) == default, arm


def test_every_repeat_credit_arm_sets_the_repeated_calls_credit_alone() -> None:
    from bench.repeat_credit import ARMS as CREDIT_ARMS

    default = _train_config([])
    for arm, flags in CREDIT_ARMS.items():
        cfg = _train_config(flags)
        assert cfg.repeated_calls == flags[1] == arm
        assert cfg.rl_config().repeated_calls == arm
        assert cfg.model_copy(update={"repeated_calls": default.repeated_calls}) == default, arm
