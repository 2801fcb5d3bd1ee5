"""Policy-loss pieces against hand-computed numbers (CPU, float64).

The running example: 5 completion tokens in 2 sequences, tokens 0-2 in sequence 0 and
tokens 3-4 in sequence 1; log ratios new - old = [0.2, 0.0, -1.0, 0.2, -0.1].
"""

from __future__ import annotations

import math

import pytest
import torch

from art_langgraph.errors import UsageError
from art_langgraph.training.loss import (
    AGGREGATIONS,
    POLICY_LOSSES,
    aggregate,
    cispo_loss,
    kl_k3,
    log_ratio,
    mismatch_metrics,
    ppo_clip_loss,
    sequence_ratio,
    token_ratio,
    truncated_is_weights,
)

F64 = torch.float64
SEQ_IDS = torch.tensor([0, 0, 0, 1, 1])
LOG_RATIOS = [0.2, 0.0, -1.0, 0.2, -0.1]


def t(values: list[float], grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=grad)


def new_old(grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    return t([-1.0, -0.5, -2.0, -0.2, -1.5], grad), t([-1.2, -0.5, -1.0, -0.4, -1.4])


def close(actual: torch.Tensor, expected: list[float]) -> None:
    assert actual.tolist() == pytest.approx(expected, abs=1e-12)


def test_log_ratio_and_token_ratio() -> None:
    new, old = new_old()
    close(log_ratio(new, old), LOG_RATIOS)
    close(token_ratio(new, old), [math.exp(x) for x in LOG_RATIOS])


def test_shape_mismatch_raises() -> None:
    with pytest.raises(UsageError, match="1-D"):
        log_ratio(t([0.0, 1.0]), t([0.0]))
    with pytest.raises(UsageError, match="1-D"):
        kl_k3(torch.zeros(2, 2), torch.zeros(2, 2))


def test_sequence_ratio_value_is_geometric_mean_per_sequence() -> None:
    new, old = new_old()
    s0 = math.exp((0.2 + 0.0 - 1.0) / 3)
    s1 = math.exp((0.2 - 0.1) / 2)
    ratio = sequence_ratio(new, old, SEQ_IDS, 2)
    close(ratio, [s0, s0, s0, s1, s1])
    geo0 = (math.exp(0.2) * math.exp(0.0) * math.exp(-1.0)) ** (1 / 3)
    assert ratio[0].item() == pytest.approx(geo0, abs=1e-12)


def test_sequence_ratio_gradient_flows_per_token_scaled_by_s() -> None:
    new, old = new_old()
    s0, s1 = math.exp(-0.8 / 3), math.exp(0.05)
    weights = t([1.0, 2.0, -1.0, 0.5, 1.0])  # e.g. advantages
    (grad,) = torch.autograd.grad((sequence_ratio(new, old, SEQ_IDS, 2) * weights).sum(), new)
    close(grad, [s0 * 1.0, s0 * 2.0, -s0, s1 * 0.5, s1 * 1.0])
    assert bool((grad != 0).all())


def test_sequence_ratio_rejects_bad_seq_ids() -> None:
    new, old = new_old()
    with pytest.raises(UsageError, match="seq_ids"):
        sequence_ratio(new, old, torch.tensor([0, 0, 0, 1, 2]), 2)
    with pytest.raises(UsageError, match="seq_ids"):
        sequence_ratio(new, old, SEQ_IDS.double(), 2)


# ratio, advantage -> PPO clip with epsilon=0.2, epsilon_high=0.28 (clip range [0.8, 1.28]):
#   1.5, +1: min(1.5, 1.28)   = 1.28  -> loss -1.28, clipped   -> grad 0
#   0.5, -1: min(-0.5, -0.8)  = -0.8  -> loss  0.8,  clipped   -> grad 0
#   1.1, +1: min(1.1, 1.1)    = 1.1   -> loss -1.1,  in range  -> grad -A = -1
#   0.7, +1: min(0.7, 0.8)    = 0.7   -> loss -0.7,  unclipped -> grad -A = -1
#   1.3, -1: min(-1.3, -1.28) = -1.3  -> loss  1.3,  unclipped -> grad -A = +1
PPO_RATIOS = [1.5, 0.5, 1.1, 0.7, 1.3]
PPO_ADVANTAGES = [1.0, -1.0, 1.0, 1.0, -1.0]


def test_ppo_clip_loss_values_and_gradients() -> None:
    ratio = t(PPO_RATIOS, grad=True)
    loss = ppo_clip_loss(ratio, t(PPO_ADVANTAGES), 0.2, 0.28)
    close(loss, [-1.28, 0.8, -1.1, -0.7, 1.3])
    (grad,) = torch.autograd.grad(loss.sum(), ratio)
    close(grad, [0.0, 0.0, -1.0, -1.0, 1.0])


def test_ppo_clip_loss_symmetric_by_default() -> None:
    loss = ppo_clip_loss(t(PPO_RATIOS), t(PPO_ADVANTAGES), 0.2)
    close(loss, [-1.2, 0.8, -1.1, -0.7, 1.3])


def test_ppo_clip_gradient_through_token_ratio() -> None:
    new, old = new_old()
    advantages = t([1.0, 1.0, 1.0, -1.0, -1.0])
    loss = ppo_clip_loss(token_ratio(new, old), advantages, 0.1)  # clip range [0.9, 1.1]
    (grad,) = torch.autograd.grad(loss.sum(), new)
    # d loss / d new_lp = -A * r where the unclipped branch wins, else 0:
    #   r = e^0.2 = 1.221 > 1.1, A = +1: clipped -> 0
    #   r = 1 and r = e^-0.1 = 0.905: inside [0.9, 1.1] -> -A * r
    #   r = e^-1 = 0.368 < 0.9, A = +1 and r = e^0.2 > 1.1, A = -1: unclipped wins -> -A * r
    r = [math.exp(x) for x in LOG_RATIOS]
    close(grad, [0.0, -r[1], -r[2], r[3], r[4]])


def test_ppo_clip_loss_rejects_bad_epsilon() -> None:
    with pytest.raises(UsageError, match="epsilon"):
        ppo_clip_loss(t([1.0]), t([1.0]), 1.5)


@pytest.mark.parametrize(
    ("epsilon", "weights"),
    [
        (None, [1.1, 1.0, math.exp(-1.0), 1.1, math.exp(-0.1)]),  # only the upper clip, 1.1
        (0.2, [1.1, 1.0, 0.8, 1.1, math.exp(-0.1)]),  # plus the lower clip, 0.8
    ],
)
def test_cispo_loss_values_and_gradient(epsilon: float | None, weights: list[float]) -> None:
    new, old = new_old()
    advantages = [1.0, -2.0, 1.0, 0.5, -1.0]
    loss = cispo_loss(token_ratio(new, old), new, t(advantages), 0.1, epsilon)
    lp = new.tolist()
    close(loss, [-w * a * x for w, a, x in zip(weights, advantages, lp, strict=True)])
    (grad,) = torch.autograd.grad(loss.sum(), new)
    close(grad, [-w * a for w, a in zip(weights, advantages, strict=True)])


def test_policy_losses_table_matches_direct_calls() -> None:
    new, old = new_old()
    ratio, advantages = token_ratio(new, old), t([1.0, -1.0, 1.0, 1.0, -1.0])
    ppo = POLICY_LOSSES["ppo"](ratio, new, advantages, 0.2, 0.28)
    assert torch.equal(ppo, ppo_clip_loss(ratio, advantages, 0.2, 0.28))
    cispo = POLICY_LOSSES["cispo"](ratio, new, advantages, None, 4.0)
    assert torch.equal(cispo, cispo_loss(ratio, new, advantages, 4.0))
    with pytest.raises(UsageError, match="epsilon"):
        POLICY_LOSSES["ppo"](ratio, new, advantages, None, 0.28)


def test_kl_k3_zero_when_equal_positive_otherwise() -> None:
    close(kl_k3(t([-1.0, -2.0]), t([-1.0, -2.0])), [0.0, 0.0])
    kl = kl_k3(t([-1.0, -2.0]), t([-1.5, -1.0]))  # ref - new = [-0.5, 1.0]
    close(kl, [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1])
    assert bool((kl > 0).all())


def test_truncated_is_weights_capped_and_detached() -> None:
    trainer = t([-1.0, -0.5, -2.0], grad=True)
    weights = truncated_is_weights(trainer, t([-1.5, -0.5, -1.0]), cap=1.5)
    close(weights, [1.5, 1.0, math.exp(-1.0)])  # exp(0.5) = 1.6487 is capped at 1.5
    assert not weights.requires_grad
    with pytest.raises(UsageError, match="cap"):
        truncated_is_weights(trainer, trainer, cap=0.0)


# per-token losses [1, 2, 3 | 4, 10]:
#   token_mean    = 20 / 5              = 4.0
#   sequence_mean = (6/3 + 14/2) / 2    = 4.5
#   constant 10   = 20 / 10             = 2.0
PER_TOKEN = [1.0, 2.0, 3.0, 4.0, 10.0]


@pytest.mark.parametrize(
    ("mode", "constant", "expected", "grad"),
    [
        ("token_mean", None, 4.0, [1 / 5] * 5),
        ("sequence_mean", None, 4.5, [1 / 6] * 3 + [1 / 4] * 2),
        ("constant", 10.0, 2.0, [1 / 10] * 5),
    ],
)
def test_aggregate_modes(
    mode: str, constant: float | None, expected: float, grad: list[float]
) -> None:
    per_token = t(PER_TOKEN, grad=True)
    value = aggregate(per_token, SEQ_IDS, 2, mode, constant)
    assert value.item() == pytest.approx(expected, abs=1e-12)
    close(torch.autograd.grad(value, per_token)[0], grad)


def test_sequence_mean_counts_an_empty_sequence_as_zero() -> None:
    value = aggregate(t(PER_TOKEN), SEQ_IDS, 3, "sequence_mean")
    assert value.item() == pytest.approx((2.0 + 7.0 + 0.0) / 3, abs=1e-12)


def test_aggregate_empty_is_zero() -> None:
    empty, no_ids = t([]), torch.tensor([], dtype=torch.long)
    for mode in ("token_mean", "sequence_mean"):
        assert aggregate(empty, no_ids, 0, mode).item() == 0.0


def test_aggregate_rejects_bad_input() -> None:
    per_token = t(PER_TOKEN)
    with pytest.raises(UsageError, match=r"'constant', 'sequence_mean', 'token_mean'"):
        aggregate(per_token, SEQ_IDS, 2, "mean")
    for bad in (None, 0.0, -1.0):
        with pytest.raises(UsageError, match="constant > 0"):
            aggregate(per_token, SEQ_IDS, 2, "constant", bad)
    with pytest.raises(UsageError, match="only used by mode='constant'"):
        aggregate(per_token, SEQ_IDS, 2, "token_mean", 10.0)
    with pytest.raises(UsageError, match="seq_ids"):
        aggregate(per_token, torch.tensor([0, 0, 1, 1]), 2, "token_mean")
    assert set(AGGREGATIONS) == {"token_mean", "sequence_mean", "constant"}


def test_mismatch_metrics() -> None:
    trainer = t([-1.0, -0.5, -2.0], grad=True)
    sampler = t([-1.5, -0.5, -1.0])  # trainer - sampler = [0.5, 0.0, -1.0]
    metrics = mismatch_metrics(trainer, sampler)
    k3 = [math.exp(0.5) - 0.5 - 1, 0.0, math.exp(-1.0) + 1.0 - 1]
    assert metrics == pytest.approx(
        {
            "abs_diff_mean": 0.5,
            "abs_diff_max": 1.0,
            "kl_k3": sum(k3) / 3,
            "ratio_mean": (math.exp(0.5) + 1.0 + math.exp(-1.0)) / 3,
        },
        abs=1e-7,
    )
    assert all(type(v) is float for v in metrics.values())


def test_mismatch_metrics_empty_is_zeros() -> None:
    metrics = mismatch_metrics(t([]), t([]))
    assert metrics == {"abs_diff_mean": 0.0, "abs_diff_max": 0.0, "kl_k3": 0.0, "ratio_mean": 0.0}
