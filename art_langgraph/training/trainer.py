"""The LoRA GRPO trainer: one optimizer step from training sequences, and its state on disk.

`LoRATrainer` owns a peft model (its own copy of the base weights, trainable LoRA
adapter on top) and an AdamW optimizer over the adapter. `rl_step` runs the micro-
batches of one step (gradients accumulate, so every normalization is exact over the
whole step), clips the gradient and steps the optimizer once. `sft_step` does the same
with a plain next-token loss on the trainable tokens.

State on disk is safetensors and JSON only (never a pickle): the peft adapter, the
optimizer's moment tensors and step counts in `optimizer.safetensors`, its param
groups in `optimizer.json`.

Logits are computed only where tokens are trained (the head runs on the gathered hidden
states, in chunks, recomputed in the backward pass): at a 49k vocabulary, full
(rows x length x vocab) logits would cost more memory than the model.

Data parallel: with `group` set (a torch.distributed process group; `distributed.py`
sets it in each rank's process), each rank steps on its share of the sequences, divides
by the whole step's token and sequence counts (summed over the ranks), and the gradients
are summed over the ranks before the one optimizer step: the update is the single-process
one, up to float rounding.

FSDP (`fsdp=group`): torch's FSDP2 (`fully_shard`) shards the model over the ranks after
peft wrapped it: each decoder layer is a unit, all-gathered for its forward and backward
only, and the root (`TokenLogprobs`: embedding, final norm, head) takes the rest; each
rank holds 1/W of the frozen base, of the adapter and of AdamW's moments. The base loads
on the CPU and only the shards move to the device. Gradients accumulate over the micro-
batches and are reduce-scattered once, as a sum (the loss is already divided by the whole
step's counts); the norm is the full one; every rank runs as many passes as the rank with
the most micro-batches (zero-weight passes), since each pass is a collective per layer.
Checkpoints are gathered and are the same files as without FSDP. Measured on the tiny
model, gloo on 2 CPU cores, W=2 against one process: the same loss, grad norm and metrics,
adapters within 2.1e-6 after two steps (`tests/scaleout/test_distributed.py`). On one
lent H200, one FSDP rank over NCCL started; its test stopped in its own helper before the
first step (docs/benchmarks.md, GPU paths). Untested: several GPUs, mixed precision (the
reduce-scatter runs in the weights' dtype), models whose decoder layers
`_no_split_modules` does not name (then the root holds everything, gathered whole).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from art_langgraph.engine.shared_base import SharedBase, model_over
from art_langgraph.errors import UsageError
from art_langgraph.runtime.devices import (
    parameter_count,
    pick_compute_dtype,
    pick_device,
    pick_dtype,
    pick_sft_compute_dtype,
    torch_dtype,
)
from art_langgraph.runtime.heap import heap_for_large_blocks
from art_langgraph.training import activations as A
from art_langgraph.training import loss as L
from art_langgraph.training.base import ProgressFn
from art_langgraph.training.config import ModelConfig, TrainConfig
from art_langgraph.training.frozen_root import root_kv, root_length
from art_langgraph.training.fsdp import (
    adapter_keys,
    full_tensor,
    shard_model,
)
from art_langgraph.training.logprobs import TokenLogprobs
from art_langgraph.training.segmented_attention import register_attention
from art_langgraph.training.sft import sure_sequences
from art_langgraph.training.state import load_state, save_state
from art_langgraph.training.tensorize import MicroBatch, TrainSequence, micro_batches

# peft still asks transformers the deprecated `is_gradient_checkpointing` during training;
# the warning would print once per run into the user's console and says nothing to them.
warnings.filterwarnings(
    "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
)


class LoRATrainer:
    """A trainable LoRA adapter over a base model, with its optimizer (a `Trainer`)."""

    group: Any = None
    """The torch.distributed process group whose ranks share each step (set in the worker
    processes of `DistributedTrainer`); None: this trainer has the whole step."""

    def __init__(
        self,
        base_path: str,
        config: ModelConfig,
        device: str | None = None,
        shared: SharedBase | None = None,
        fsdp: Any = None,
    ) -> None:
        """`shared`: an engine's frozen weights in this process; when dtype and device match,
        the LoRA wraps them instead of a second copy loaded from `base_path`. `fsdp`: a
        torch.distributed process group to shard the model over (FSDP2: each rank keeps 1/W
        of the base, the adapter and its optimizer state; it becomes `group` too); None: this
        process holds the whole model."""
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.config = config
        self._in_sft = False
        """Within an SFT step (`_sft_precision`)."""
        self.device = torch.device(pick_device(device))
        auto = "auto" in (config.dtype, config.compute_dtype)
        params = parameter_count(base_path) if auto else None
        name = pick_dtype(config.dtype, self.device.type, params)
        self.dtype = torch_dtype(name)
        self.compute_dtype = torch_dtype(
            pick_compute_dtype(config.compute_dtype, name, self.device.type, params)
        )
        self.tokenizer = AutoTokenizer.from_pretrained(base_path)
        self.shares_base = (
            shared is not None and shared.dtype == self.dtype and shared.device == self.device
        )
        attn = register_attention()
        if self.shares_base:
            assert shared is not None
            base = model_over(shared.tensors, shared.like, attn_implementation=attn)
        else:
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                base_path, dtype=self.dtype, attn_implementation=attn
            )
            # FSDP: loaded on the CPU; `fully_shard` moves only this rank's shards to the device.
            base = loaded if fsdp is not None else loaded.to(self.device)
        self._checkpointed: list[Any] = []  # the layers whose flag turns checkpointing on
        if config.gradient_checkpointing:
            kwargs = {"use_reentrant": False}
            if hasattr(base, "activation_checkpointing_enable"):
                base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:  # transformers before the rename
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            base.enable_input_require_grads()
            # The decoder layers: the model itself also gets the attribute, but its flag
            # recomputes nothing, and counted as a layer it skewed "auto"'s layer count.
            self._checkpointed = [
                m
                for m in base.modules()
                if hasattr(m, "_gradient_checkpointing_func")
                and m is not getattr(base, "model", None)
            ]
        self._sizes = base.config  # the activation estimates read it in the step's dtype
        lora = LoraConfig(
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=list(config.target_modules),
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.model = get_peft_model(base, lora)
        self._forward: Any = TokenLogprobs(base)  # FSDP: the sharded root
        self._adapter_keys: list[str] = []  # FSDP: each param's key in a saved adapter
        self.fsdp = fsdp is not None
        if fsdp is not None:
            self.group = fsdp
            self._adapter_keys = adapter_keys(self.model)
            self._forward = shard_model(self._forward, fsdp, self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=5e-6, betas=(0.9, 0.99), weight_decay=0.0
        )

    # ------------------------------------------------------------------ steps
    def _configure(self, lr: float, betas: tuple[float, float], weight_decay: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"], g["betas"], g["weight_decay"] = lr, betas, weight_decay

    @contextlib.contextmanager
    def _sft_precision(self, config: TrainConfig) -> Iterator[None]:
        """Within: an SFT step's matmul dtype (`TrainConfig.sft_compute_dtype`), which the
        activation estimates follow, and its activation budget (`_budget`)."""
        saved = self.compute_dtype
        name = str(saved).removeprefix("torch.")
        self.compute_dtype = torch_dtype(
            pick_sft_compute_dtype(config.sft_compute_dtype, name, self.device.type)
        )
        self._in_sft = True
        try:
            yield
        finally:
            self.compute_dtype, self._in_sft = saved, False

    @property
    def _budget(self) -> int:
        """The step's activation budget: `activations.SFT_CHECKPOINT_BYTES` in an SFT step,
        else `AUTO_CHECKPOINT_BYTES` (read when used, so a test may patch either)."""
        return A.SFT_CHECKPOINT_BYTES if self._in_sft else A.AUTO_CHECKPOINT_BYTES

    @property
    def _activation_bytes(self) -> int:
        """What a token's backward keeps (`activations`), in the wider of the weights' and the
        step's dtype: autocast keeps float32's residual stream and norms besides bfloat16
        copies of the matmul inputs, as much as float32 in all (SmolLM2-135M, saved-tensor
        hooks: 41 KB a layer and token against 40; bfloat16 weights, 23)."""
        size = max(self.dtype.itemsize, self.compute_dtype.itemsize)
        return A.activation_bytes_per_token(self._sizes, size)

    @property
    def _layer_input_bytes(self) -> int:
        """A recomputed layer's input, a token's hidden state, in the weights' dtype."""
        return int(getattr(self._sizes, "hidden_size", 0) or 0) * self.dtype.itemsize

    def _autocast(self) -> Any:
        """bfloat16 autocast over the transformer when the step's compute dtype (the
        model's, ModelConfig.compute_dtype, or an SFT step's) differs from its weights'."""
        if self.compute_dtype == self.dtype:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def _logprobs(
        self, mb: MicroBatch, target_mask: torch.Tensor, frozen_root: bool = False
    ) -> torch.Tensor:
        """Log-probability of each target token given its prefix. Returns (N,) in row-major
        order of `target_mask` (R, L), whose column 0 must be False (no prefix).

        Pays only for what is trained: the transformer runs without its head, the hidden
        states before the N targets are gathered, and the head and log-softmax run on those
        alone, in chunks (`token_logprobs`): never (R, L, V) logits. `frozen_root`: a
        prefix tree's root runs first without gradient (`frozen_root.root_length`)."""
        dev = self.device
        extra: dict[str, Any] = {}
        mask: torch.Tensor | None = mb.attention_mask.to(dev)
        ids, pos = mb.input_ids.to(dev), mb.position_ids.to(dev)
        cut = 0
        if mb.segments is not None and self.config.segmented_attention:
            # Each block attends to what it sees alone (`training.segments`): no (L, L) mask.
            mask, extra = None, {"segments": mb.segments}
            if frozen_root and self.group is None:
                cut = root_length(mb.segments, target_mask)
        elif mask is not None and mask.dim() == 4:
            # Additive form: eager attention adds a 4D mask to the scores (a bool one would be
            # added as 0/1 and let packed sequences see each other); sdpa reads either form.
            mask = torch.zeros(mask.shape, dtype=self.dtype, device=dev).masked_fill(
                ~mask, torch.finfo(self.dtype).min
            )
        if cut:
            with self._autocast():
                extra["prefix"] = root_kv(self.model.get_base_model().model, ids, pos, cut)
        self._checkpoint_if_large(ids[:, cut:].numel())
        assert not bool(target_mask[:, 0].any()), "a target in column 0 has no prefix"
        return self._forward(
            self._autocast(),
            ids[:, cut:],
            mask,
            pos[:, cut:],
            target_mask[:, cut + 1 :],  # (R, L-1-cut): the state at t-1 predicts token t
            keep_bytes=self._budget // 4,
            **extra,
        )

    def _checkpoint_if_large(self, tokens: int) -> None:
        """With gradient_checkpointing="auto": recompute in the backward pass just enough
        layers of a micro-batch of `tokens` with gradient (`activations.layers_to_recompute`)
        that the others' activations fit the step's budget."""
        if self.config.gradient_checkpointing != "auto" or not self._checkpointed:
            return
        n = len(self._checkpointed)
        budget = self._budget
        flags = A.layers_to_recompute(
            tokens, n, self._activation_bytes, self._layer_input_bytes, budget
        )
        for layer, on in zip(self._checkpointed, flags, strict=True):
            layer.gradient_checkpointing = on

    @heap_for_large_blocks()  # an engine's mmap threshold would halve this step's speed
    def rl_step(
        self, seqs: list[TrainSequence], config: TrainConfig, progress: ProgressFn | None = None
    ) -> dict[str, float]:
        """One GRPO optimizer step over `seqs`; returns metrics."""
        t0 = time.perf_counter()
        self.model.train()
        self._configure(_rate(config), config.adam_betas, config.weight_decay)
        self.optimizer.zero_grad(set_to_none=True)
        n_total, s_total = self._totals(seqs)
        if n_total == 0:
            return {
                "trainable_tokens": 0.0,
                "sequences": float(s_total),
                "skipped_optimizer_step": 1.0,
            }
        acc: dict[str, float] = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0}
        mismatch: list[tuple[torch.Tensor, torch.Tensor]] = []
        real = cells = 0
        shared_tokens = 0.0
        batches, passes = self._micro_batches(seqs, config)
        for k, mb in enumerate(batches):
            self._sync_gradients(last=k == passes - 1)
            dev = self.device
            mask = mb.target_mask.to(dev)
            new_lp = self._logprobs(mb, mask)  # (N,)
            sampler = mb.sampler_logprobs.to(dev)[mask]  # (N,)
            known = ~torch.isnan(sampler)
            sampler = torch.where(known, sampler, new_lp.detach())
            adv = mb.advantages.to(dev)[mask]  # (N,)
            copies = mb.weights.to(dev)[mask]  # (N,): identical sequences trained once
            sid = mb.seq_ids.to(dev)[mask]  # (N,)
            n_mb = int(mask.sum())
            mismatch.append((new_lp.detach()[known], sampler[known]))
            if config.truncated_is_cap is not None:
                old = new_lp.detach()
                weight = L.truncated_is_weights(new_lp.detach(), sampler, config.truncated_is_cap)
            else:
                old, weight = sampler, None
            if config.importance_sampling_level == "sequence":
                ratio = L.sequence_ratio(new_lp, old, sid, mb.num_sequences)
            else:
                ratio = L.token_ratio(new_lp, old)
            if config.policy_loss == "cispo":
                per_tok = L.cispo_loss(ratio, new_lp, adv, config.clip_high)
            else:
                per_tok = L.ppo_clip_loss(ratio, adv, config.epsilon, config.clip_high)
            clipped = ((ratio < 1 - config.epsilon) | (ratio > 1 + config.clip_high)).float()
            clipped = clipped * copies
            if weight is not None:
                per_tok = per_tok * weight
            per_tok = per_tok * copies
            policy_tok = per_tok
            if config.beta > 0:
                with torch.no_grad(), self.model.disable_adapter():
                    ref = self._logprobs(mb, mask)
                kl = L.kl_k3(new_lp, ref) * copies
                per_tok = per_tok + config.beta * kl
                acc["kl"] += float(kl.detach().sum())
            scale = {
                "token_mean": n_mb / n_total,
                "sequence_mean": mb.num_sequences / s_total,
                "constant": 1.0,
            }[config.loss_normalization]
            loss = (
                L.aggregate(
                    per_tok, sid, mb.num_sequences, config.loss_normalization, config.loss_constant
                )
                * scale
            )
            loss.backward()
            acc["loss"] += float(loss.detach())
            acc["policy_loss"] += (
                float(L.aggregate(policy_tok.detach(), sid, mb.num_sequences, "token_mean"))
                * n_mb
                / n_total
            )
            acc["clip_fraction"] += float(clipped.sum())
            real += mb.real_tokens
            cells += mb.input_ids.numel()
            shared_tokens += mb.stats["shared_prefix_tokens"]
            if progress:
                progress("micro_batch", {"index": k, "tokens": n_mb, "total_tokens": n_total})
        for k in range(len(batches), passes):
            self._idle_pass(last=k == passes - 1, reference=config.beta > 0)
        grad_norm = self._optimizer_step(config.max_grad_norm)
        if progress:
            progress("optimizer_step", {"grad_norm": grad_norm})
        trainer_lp = torch.cat([a for a, _ in mismatch]) if mismatch else torch.zeros(0)
        sampler_lp = torch.cat([b for _, b in mismatch]) if mismatch else torch.zeros(0)
        if self.group is not None:  # the whole step's metrics, on every rank
            sums = [acc["loss"], acc["policy_loss"], acc["kl"], acc["clip_fraction"]]
            summed = self._sum([*sums, real, cells, shared_tokens])
            acc.update(zip(("loss", "policy_loss", "kl", "clip_fraction"), summed[:4], strict=True))
            real, cells, shared_tokens = int(summed[4]), int(summed[5]), summed[6]
            trainer_lp, sampler_lp = self._cat(trainer_lp), self._cat(sampler_lp)
        mm = L.mismatch_metrics(trainer_lp, sampler_lp)
        seconds = time.perf_counter() - t0
        return {
            "loss": acc["loss"],
            "policy_loss": acc["policy_loss"],
            "kl": acc["kl"] / max(n_total, 1),
            "clip_fraction": acc["clip_fraction"] / max(n_total, 1),
            "grad_norm": grad_norm,
            "learning_rate": _rate(config),
            "trainable_tokens": float(n_total),
            "sequences": float(s_total),
            "padding_waste": 1 - real / max(cells, 1),
            "shared_prefix_tokens": shared_tokens,
            "train_seconds": seconds,
            "train_tokens_per_s": real / seconds if seconds > 0 else 0.0,
            **{f"mismatch/{k}": v for k, v in mm.items()},
        }

    @heap_for_large_blocks()
    def sft_step(self, seqs: list[TrainSequence], config: TrainConfig) -> dict[str, float]:
        """One optimizer step of next-token cross-entropy on the trainable tokens (token
        mean), in an SFT step's precision (`_sft_precision`)."""
        with self._sft_precision(config):
            return self._sft_step(seqs, config)

    def _sft_step(self, seqs: list[TrainSequence], config: TrainConfig) -> dict[str, float]:
        t0 = time.perf_counter()
        self.model.train()
        self._configure(_rate(config), config.adam_betas, config.weight_decay)
        self.optimizer.zero_grad(set_to_none=True)
        n_total, _ = self._totals(seqs)
        if n_total == 0:
            return {"loss": 0.0, "trainable_tokens": 0.0, "skipped_optimizer_step": 1.0}
        total = sure = 0.0
        batches, passes = self._micro_batches(seqs, config)
        for k, mb in enumerate(batches):
            self._sync_gradients(last=k == passes - 1)
            mask = mb.target_mask.to(self.device)
            lp = self._logprobs(mb, mask, frozen_root=config.sft_frozen_root)  # (N,)
            loss = -lp.sum() / n_total
            loss.backward()
            total += float(loss.detach())
            sure += sure_sequences(lp.detach(), mb.seq_ids.to(self.device)[mask])
        for k in range(len(batches), passes):
            self._idle_pass(last=k == passes - 1, reference=False)
        grad_norm = self._optimizer_step(config.max_grad_norm)
        if self.group is not None:
            total, sure = self._sum([total, sure])
        return {
            "loss": total,
            "sure_sequences": sure,
            "grad_norm": grad_norm,
            "trainable_tokens": float(n_total),
            "train_seconds": time.perf_counter() - t0,
        }

    def _optimizer_step(self, max_norm: float | None) -> float:
        if self.group is not None and not self.fsdp:  # FSDP summed them in its reduce-scatter
            self._sum_gradients()
        limit = max_norm if max_norm is not None else math.inf
        norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(self.params, limit)))
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # ------------------------------------------------------------ data parallel
    def _micro_batches(
        self, seqs: list[TrainSequence], config: TrainConfig
    ) -> tuple[list[MicroBatch], int]:
        """This rank's micro-batches of `seqs`, and the passes it runs over them (`_passes`)."""
        batches = list(
            micro_batches(
                seqs,
                row_length=_row_length(seqs, config),
                micro_batch_tokens=config.micro_batch_tokens,
                pack=config.pack_sequences,
                share_prefixes=config.share_prefixes,
                alone_tokens=self._alone_tokens(),
                tree_tokens=self._tree_tokens(),
                bucket_width=self.device.type == "cpu" and self.compute_dtype == torch.bfloat16,
            )
        )
        return batches, self._passes(len(batches))

    def _alone_tokens(self) -> int | None:
        """Under gradient_checkpointing="auto": `activations.alone_tokens` of the step's budget."""
        if self.config.gradient_checkpointing != "auto" or not self._activation_bytes:
            return None
        return A.alone_tokens(self._budget, self._activation_bytes)

    def _tree_tokens(self) -> int | None:
        """Under gradient_checkpointing="auto": `activations.tree_tokens` of the step's budget."""
        if self.config.gradient_checkpointing != "auto" or not self._activation_bytes:
            return None
        layers = max(len(self._checkpointed), 1)
        return A.tree_tokens(self._budget, layers, self._activation_bytes, self._layer_input_bytes)

    def _passes(self, batches: int) -> int:
        """Forward/backward passes this rank runs: its micro-batches, or under FSDP the most
        any rank has (every pass all-gathers each layer, so all ranks must run as many)."""
        if not self.fsdp:
            return batches
        return int(self._all_reduce(torch.tensor([batches], dtype=torch.int64), "max")[0])

    def _sync_gradients(self, last: bool) -> None:
        """FSDP: accumulate the passes' gradients on this rank and reduce-scatter them once,
        after the step's last backward (one sum over the ranks, as `_sum_gradients`)."""
        if self.fsdp:
            self._forward.set_requires_gradient_sync(last)

    def _idle_pass(self, last: bool, reference: bool) -> None:
        """A pass that adds nothing (its loss times 0) on a rank out of micro-batches, so
        that its collectives meet the other ranks': a forward (and the reference forward,
        with `reference`) and a backward, as a real micro-batch runs."""
        self._sync_gradients(last)
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)  # (1, 2)
        before = torch.ones((1, 1), dtype=torch.bool, device=self.device)  # (1, 1)
        positions = torch.arange(2, device=self.device).unsqueeze(0)  # (1, 2)
        args = (ids, torch.ones_like(ids), positions, before)
        lp = self._forward(self._autocast(), *args, keep_bytes=self._budget // 4)  # (1,)
        if reference:
            with torch.no_grad(), self.model.disable_adapter():
                self._forward(self._autocast(), *args, keep_bytes=self._budget // 4)
        (lp.sum() * 0.0).backward()

    def _totals(self, seqs: list[TrainSequence]) -> tuple[int, int]:
        """The whole step's trainable tokens and sequences, each counted `copies` times:
        the loss's normalizers."""
        n = sum(x.num_trainable * x.copies for x in seqs)
        s = sum(x.copies for x in seqs)
        if self.group is None:
            return n, s
        both = self._all_reduce(torch.tensor([n, s], dtype=torch.int64))
        return int(both[0]), int(both[1])

    def _sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (float64)."""
        return [float(v) for v in self._all_reduce(torch.tensor(values, dtype=torch.float64))]

    def _cat(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's 1-D `t`, concatenated in rank order."""
        import torch.distributed as dist

        parts: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(parts, t.detach().cpu(), group=self.group)
        return torch.cat(parts)

    def _sum_gradients(self) -> None:
        """Sum the LoRA gradients over the ranks, in one flat all-reduce. Each rank's loss is
        already divided by the whole step's normalizer, so the sum is the single-process
        gradient (not a mean over ranks, as DDP takes). A parameter without a gradient on
        every rank keeps none (AdamW skips it, as it would in one process)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        has = torch.tensor([float(p.grad is not None) for p in self.params]).to(grads[0])
        flat = self._all_reduce(torch.cat([*(g.reshape(-1) for g in grads), has])).to(self.device)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        for p, g, present in zip(self.params, grads, flat[offset:].tolist(), strict=True):
            p.grad = g if present > 0 else None

    def _all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """`t` summed (op "max": its maximum) over the ranks (a new tensor; on the CPU for
        gloo)."""
        import torch.distributed as dist

        on = "cpu" if dist.get_backend(self.group) == "gloo" else self.device
        out = t.detach().to(on).clone()
        reduce = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM
        dist.all_reduce(out, op=reduce, group=self.group)
        return out

    def close(self) -> None:
        """Nothing to release beyond memory (the `Trainer` protocol's close)."""

    # ------------------------------------------------------------------ state
    def save(self, folder: Path) -> None:
        """Write the adapter and the optimizer state into `folder` (which must exist):
        `state.save_state`."""
        save_state(
            folder, self.model, self.optimizer, self.params, self.group if self.fsdp else None
        )

    def param_numel(self) -> dict[str, int]:
        """Parameters this process holds ("*_local": under FSDP its shards) and the model's
        ("*_full"), for the frozen base and the trainable adapter."""
        from torch.distributed.tensor import DTensor

        out = dict.fromkeys(("base_local", "base_full", "lora_local", "lora_full"), 0)
        for p in self._forward.parameters():
            kind = "lora" if p.requires_grad else "base"
            local = p.to_local() if isinstance(p, DTensor) else p
            out[f"{kind}_local"] += local.numel()
            out[f"{kind}_full"] += p.numel()
        return out

    def load(self, folder: Path) -> None:
        """Restore the adapter weights and the optimizer state saved by `save`
        (`state.load_state`); a trainer whose `load` failed must be thrown away."""
        load_state(
            folder,
            self.model,
            self.optimizer,
            self.params,
            self._adapter_keys if self.fsdp else None,
            self.device,
        )


def _row_length(seqs: list[TrainSequence], config: TrainConfig) -> int:
    """Pack into rows as long as the longest sequence: a dense attention mask costs L² per
    row, so longer rows would cost more compute than the padding they save."""
    return min(config.max_seq_length, max((len(s) for s in seqs), default=1))


def _rate(config: TrainConfig) -> float:
    """The step's learning rate; a trainer is given a number (`TrainConfig.for_model`)."""
    if config.learning_rate is None:
        raise UsageError(
            "TrainConfig.learning_rate is None: a backend sets the base model's own "
            "(TrainConfig.for_model(base_model)); give one when calling a trainer directly"
        )
    return config.learning_rate
