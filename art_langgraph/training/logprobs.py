"""Each trained token's log-probability under the model, in memory bounded for any length.

`TokenLogprobs` is the module the trainer calls (and the root FSDP wraps): the decoder,
then the output head on only the hidden states that predict a trained token.
`token_logprobs` runs that head `HEAD_CHUNK_ROWS` rows at a time, recomputing each chunk's
logits in the backward pass unless all of them fit `keep_bytes`, so a step never holds
(rows, length, vocabulary) logits.

Left out: the loss (`loss.py`), what to recompute in the decoder (`trainer.py`'s
gradient checkpointing) and the model's weights (`shared_base.py`).
"""

from __future__ import annotations

from typing import Any

import torch


class TokenLogprobs(torch.nn.Module):
    """The transformer, then the head on the hidden states before each target token: the
    module `LoRATrainer` calls for log-probabilities. Under FSDP it is the root that
    `fully_shard` wraps (its forward all-gathers what the layers do not own: the embedding,
    the final norm, the head), since the trainer never calls the causal LM's own forward."""

    def __init__(self, base: torch.nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(
        self,
        autocast: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        before: torch.Tensor,
        *,
        keep_bytes: int = 0,
        **extra: Any,
    ) -> torch.Tensor:
        """input_ids, position_ids (R, L); before (R, L-1) bool: the positions whose state
        predicts a trained token. Returns (N,) log-probabilities, row-major over `before`.
        `autocast` covers the transformer only (the head stays in the weights dtype); the
        head's logits are kept for the backward pass up to `keep_bytes` (`token_logprobs`)."""
        base: Any = self.base
        with autocast:
            hidden = base.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
                **extra,
            ).last_hidden_state  # (R, L, H)
        head = base.get_output_embeddings()
        h = hidden[:, :-1][before].to(head.weight.dtype)  # (N, H)
        targets = input_ids[:, 1:][before]  # (N,)
        return token_logprobs(h, head, targets, chunk=HEAD_CHUNK_ROWS, keep_bytes=keep_bytes)


def token_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    chunk: int = 1024,
    keep_bytes: int = 0,
) -> torch.Tensor:
    """log softmax(head(hidden))[target] per row, `chunk` rows at a time. hidden (N, H),
    targets (N,) -> (N,). Under autograd each chunk's logits (chunk, V) are recomputed in
    the backward pass instead of being kept, so memory stays O(chunk x V) for any N; where
    all N rows' float32 logits take at most `keep_bytes`, they are kept instead (no second
    head matmul: on SmolLM2 a sixth of a short-prompt step)."""
    from torch.utils.checkpoint import checkpoint

    vocab = int(getattr(head, "out_features", 0) or 0)
    recompute = hidden.shape[0] * vocab * 4 > keep_bytes

    def one(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = head(h).float()  # (c, V)
        return logits.gather(-1, t.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)  # (c,)

    parts = []
    for i in range(0, hidden.shape[0], chunk):
        h, t = hidden[i : i + chunk], targets[i : i + chunk]
        if recompute and torch.is_grad_enabled() and h.requires_grad:
            parts.append(checkpoint(one, h, t, use_reentrant=False))
        else:
            parts.append(one(h, t))
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


HEAD_CHUNK_ROWS = 256
"""Rows of the head (hidden -> vocabulary logits) computed at once, forward and backward.
A chunk's float32 logits, their softmax and their gradient are live together: about 5 x
rows x V x 4 bytes, 1 GB at 1024 rows of SmolLM2's 49,152-token vocabulary, which took a
real-model `art-mcp train` run on an AMX host to 4.3 GiB at its 3,000-token steps.
bench.head_chunk (SmolLM2-135M, an 8 x 4 agent batch, bf16 on 2 AMX cores): 256 rows
took the trainer's peak from 2,251 to 1,633 MiB at 1.01x the step time of 1,024 rows
(128: 1,590 MiB, 0.91x, within the run's noise)."""
