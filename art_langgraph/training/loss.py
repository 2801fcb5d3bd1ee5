"""The GRPO policy loss as small pure torch functions on flattened completion tokens.

Every tensor is 1-D over the N trainable tokens of a batch (the caller flattens packed rows
and drops prompt/padding tokens); `seq_ids` (N,) says which sequence 0..S-1 each token is
from. Ratios: per token (PPO/GRPO) or per sequence (GSPO, "GSPO-token" form). Policy
terms, picked from `POLICY_LOSSES`: PPO clip and CISPO. Extras: the k3 KL estimator,
truncated importance-sampling weights for sampler/trainer mismatch, and `aggregate`, whose
modes (`AGGREGATIONS`) are DAPO's token mean, GRPO's sequence mean and Dr. GRPO's constant.

Left out on purpose: computing logprobs from logits, masking, advantage computation
(`advantages.py`), combining the terms (the trainer adds `beta * kl`, multiplies by the IS
weights) and any cross-process normalisation (pass a global `constant` instead).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from art_langgraph.errors import UsageError


def _same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1 or any(len(s) != 1 for s in shapes.values()):
        raise UsageError(f"expected 1-D tensors of one shape (N,), got {shapes}")


def _check_seq_ids(seq_ids: Tensor, n: int, num_seqs: int) -> None:
    if seq_ids.shape != (n,) or seq_ids.dtype not in (torch.int64, torch.int32):
        raise UsageError(
            f"seq_ids must be an integer tensor of shape ({n},), got {seq_ids.dtype} "
            f"{tuple(seq_ids.shape)}"
        )
    if num_seqs < 0:
        raise UsageError(f"num_seqs is {num_seqs}; it must be >= 0")
    if n:
        lo, hi = (int(x) for x in torch.aminmax(seq_ids))
        if lo < 0 or hi >= num_seqs:
            raise UsageError(f"seq_ids must lie in [0, {num_seqs}), got min {lo}, max {hi}")


def _per_sequence_mean(values: Tensor, seq_ids: Tensor, num_seqs: int) -> Tensor:
    """Mean of `values` (N,) over each sequence's tokens, (S,); 0 for a sequence with none."""
    zeros = torch.zeros(num_seqs, dtype=values.dtype, device=values.device)  # (S,)
    sums = zeros.index_add(0, seq_ids, values)  # (S,)
    return sums / zeros.index_add(0, seq_ids, torch.ones_like(values)).clamp(min=1)  # (S,)


def log_ratio(new_lp: Tensor, old_lp: Tensor) -> Tensor:
    """Per-token log importance ratio `new_lp - old_lp`, shape (N,)."""
    _same_shape(new_lp=new_lp, old_lp=old_lp)
    return new_lp - old_lp  # (N,)


def token_ratio(new_lp: Tensor, old_lp: Tensor) -> Tensor:
    """Per-token importance ratio `exp(new_lp - old_lp)`, shape (N,) (PPO / GRPO)."""
    return torch.exp(log_ratio(new_lp, old_lp))  # (N,)


def sequence_ratio(new_lp: Tensor, old_lp: Tensor, seq_ids: Tensor, num_seqs: int) -> Tensor:
    """GSPO's sequence ratio in "GSPO-token" form, one value per token, shape (N,).

    `s_i = exp(mean over the tokens t of sequence i of (new_lp_t - old_lp_t))`, the geometric
    mean of the token ratios. Each token gets `sg(s_i) * exp(new_lp_t - sg(new_lp_t))`: its
    value is `s_i`, and its gradient w.r.t. `new_lp_t` is `s_i` (per token, not via the mean).
    """
    lr = log_ratio(new_lp, old_lp)  # (N,)
    _check_seq_ids(seq_ids, lr.shape[0], num_seqs)
    seq_log = _per_sequence_mean(lr, seq_ids, num_seqs).detach()  # (S,)
    return torch.exp(seq_log[seq_ids] + new_lp - new_lp.detach())  # (N,)


def ppo_clip_loss(
    ratio: Tensor, advantages: Tensor, epsilon: float, epsilon_high: float | None = None
) -> Tensor:
    """PPO's clipped surrogate per token, `-min(r * A, clip(r, 1 - eps, 1 + eps_high) * A)`, (N,).

    `epsilon_high=None` clips symmetrically (`epsilon`); DAPO's clip-higher sets it larger.
    A token whose clipped branch wins gets zero gradient.
    """
    _same_shape(ratio=ratio, advantages=advantages)
    high = epsilon if epsilon_high is None else epsilon_high
    if not (0 <= epsilon < 1 and high >= 0):
        raise UsageError(f"need 0 <= epsilon < 1 and epsilon_high >= 0, got {epsilon}, {high}")
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + high)  # (N,)
    return -torch.min(ratio * advantages, clipped * advantages)  # (N,)


def cispo_loss(
    ratio: Tensor,
    new_lp: Tensor,
    advantages: Tensor,
    epsilon_high: float,
    epsilon: float | None = None,
) -> Tensor:
    """MiniMax-M1's CISPO per token, `-sg(clip(r, 1 - eps, 1 + eps_high)) * A * new_lp`, (N,).

    The clipped ratio is a detached weight, so every token keeps a gradient of
    `-clip(r) * A` w.r.t. `new_lp`. `epsilon=None` leaves out the lower bound (as the paper).
    """
    _same_shape(ratio=ratio, new_lp=new_lp, advantages=advantages)
    if epsilon_high < 0 or (epsilon is not None and not 0 <= epsilon <= 1):
        raise UsageError(
            f"need epsilon_high >= 0 and epsilon in [0, 1] or None, got {epsilon_high}, {epsilon}"
        )
    low = None if epsilon is None else 1 - epsilon
    weight = torch.clamp(ratio.detach(), min=low, max=1 + epsilon_high)  # (N,)
    return -weight * advantages * new_lp  # (N,)


def kl_k3(new_lp: Tensor, ref_lp: Tensor) -> Tensor:
    """k3 estimator of KL(pi || ref) per token, `exp(ref - new) - (ref - new) - 1` (>= 0), (N,)."""
    _same_shape(new_lp=new_lp, ref_lp=ref_lp)
    d = ref_lp - new_lp  # (N,)
    return torch.exp(d) - d - 1  # (N,)


def truncated_is_weights(trainer_lp: Tensor, sampler_lp: Tensor, cap: float) -> Tensor:
    """Detached `min(exp(trainer_lp - sampler_lp), cap)` per token, (N,) (Yao et al., TIS).

    Corrects for the sampler's logprobs differing from the trainer's on the same tokens.
    """
    _same_shape(trainer_lp=trainer_lp, sampler_lp=sampler_lp)
    if not cap > 0:
        raise UsageError(f"cap is {cap}; it must be > 0 (1.5 to 5 is usual)")
    return torch.exp(trainer_lp - sampler_lp).clamp(max=cap).detach()  # (N,)


PolicyLoss = Callable[[Tensor, Tensor, Tensor, float | None, float], Tensor]
"""`(ratio, new_lp, advantages, epsilon, epsilon_high) -> per-token loss`, all tensors (N,)."""


def _ppo(r: Tensor, lp: Tensor, a: Tensor, eps: float | None, eps_high: float) -> Tensor:
    if eps is None:
        raise UsageError("the 'ppo' policy loss needs epsilon (e.g. 0.2)")
    return ppo_clip_loss(r, a, eps, eps_high)


def _cispo(r: Tensor, lp: Tensor, a: Tensor, eps: float | None, eps_high: float) -> Tensor:
    return cispo_loss(r, lp, a, eps_high, eps)


POLICY_LOSSES: dict[str, PolicyLoss] = {"ppo": _ppo, "cispo": _cispo}
"""Policy losses by name; "ppo" ignores `new_lp`, "cispo" treats `epsilon=None` as no lower clip."""

Aggregation = Callable[[Tensor, Tensor, int, float | None], Tensor]
"""`(per_token (N,), seq_ids (N,), num_seqs, constant) -> scalar`."""


def _token_mean(x: Tensor, seq_ids: Tensor, num_seqs: int, constant: float | None) -> Tensor:
    return x.sum() / max(x.shape[0], 1)


def _sequence_mean(x: Tensor, seq_ids: Tensor, num_seqs: int, constant: float | None) -> Tensor:
    return _per_sequence_mean(x, seq_ids, num_seqs).sum() / max(num_seqs, 1)


def _constant(x: Tensor, seq_ids: Tensor, num_seqs: int, constant: float | None) -> Tensor:
    if constant is None or not constant > 0:
        raise UsageError(
            f"mode='constant' needs constant > 0 (Dr. GRPO: G * max_tokens), got {constant!r}"
        )
    return x.sum() / constant


AGGREGATIONS: dict[str, Aggregation] = {
    "token_mean": _token_mean,
    "sequence_mean": _sequence_mean,
    "constant": _constant,
}
"""token_mean: sum / N (DAPO); sequence_mean: mean within each sequence, then over the
`num_seqs` sequences (GRPO paper; a sequence with no tokens counts as 0, as in TRL);
constant: sum / constant (Dr. GRPO)."""


def aggregate(
    per_token: Tensor, seq_ids: Tensor, num_seqs: int, mode: str, constant: float | None = None
) -> Tensor:
    """Reduce a per-token loss (N,) to a scalar with one of `AGGREGATIONS`.

    Raises:
        UsageError: unknown `mode` (the message lists the options), `constant` missing or
            not > 0 for "constant", `constant` given for another mode, or bad `seq_ids`.
    """
    if mode not in AGGREGATIONS:
        raise UsageError(f"unknown aggregation mode {mode!r}; choose one of {sorted(AGGREGATIONS)}")
    if constant is not None and mode != "constant":
        raise UsageError(f"constant={constant!r} is only used by mode='constant', not {mode!r}")
    _check_seq_ids(seq_ids, per_token.shape[0], num_seqs)
    return AGGREGATIONS[mode](per_token, seq_ids, num_seqs, constant)


@torch.no_grad()
def mismatch_metrics(trainer_lp: Tensor, sampler_lp: Tensor) -> dict[str, float]:
    """Sampler-vs-trainer logprob mismatch on the same tokens, as python floats.

    Keys: `abs_diff_mean`, `abs_diff_max` (of `trainer_lp - sampler_lp`), `kl_k3` (mean k3
    estimate of KL(sampler || trainer), tokens drawn from the sampler) and `ratio_mean`
    (mean of `exp(trainer_lp - sampler_lp)`, ~1 when they agree). Empty input gives zeros.
    """
    _same_shape(trainer_lp=trainer_lp, sampler_lp=sampler_lp)
    if trainer_lp.numel() == 0:
        return dict.fromkeys(("abs_diff_mean", "abs_diff_max", "kl_k3", "ratio_mean"), 0.0)
    diff = (trainer_lp - sampler_lp).float()  # (N,)
    return {
        "abs_diff_mean": diff.abs().mean().item(),
        "abs_diff_max": diff.abs().max().item(),
        "kl_k3": kl_k3(sampler_lp.float(), trainer_lp.float()).mean().item(),
        "ratio_mean": diff.exp().mean().item(),
    }
