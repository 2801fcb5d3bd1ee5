"""The engine's linear layers with weights prepacked for oneDNN on the CPU.

`torch.nn.functional.linear` on the CPU hands each call to a GEMM that reorders the
weight into its own blocked layout every time. A decode step multiplies a few rows by
every weight of the model, so that reorder is most of the step: on a 2-core AVX2 host a
(8, 576) x (576, 1536) product took 454-664 us through `F.linear` and 261-294 us with the
weight reordered once for oneDNN (`torch.ops.mkldnn._reorder_linear_weight`) and
multiplied by `torch.ops.mkldnn._linear_pointwise` (what inductor's freezing pass and
vLLM's CPU backend do). One decode step of SmolLM2-135M, 8 rows of 700 tokens, went
from 161 to 124 ms (bench/results/engine_packed/engine_packed.json).

`pack_linears(model)` turns every plain `nn.Linear` of a module tree (not peft's LoRA
factors, which adapter loads rewrite in place) into a `PackedLinear`: the same module,
the same dense weight, plus the packed copy it multiplies by when no gradient is wanted.
The packed copy is made from the weight as it is at that call: whoever writes a packed
module's weight calls `pack_linears` again (the engine does after merging an adapter).
A packed multiply runs at one of few row counts (`bucket_rows`). `PackedLinear` falls
back to `F.linear` when gradients are on, or the input is not a CPU tensor of the
weight's dtype.

`set_packed` gives a module a packed copy of other weights than its own: the engine's
merged copy (`TorchEngineConfig.merge_latest`) is a module tree over the base's tensors
whose LoRA targets multiply by packed base + LoRA weights and whose other layers share
the base's packed copies, so it costs only its packed targets.

Costs one more copy of each packed weight in memory. Numerics: oneDNN sums in another
order, so outputs differ from `F.linear` at float32 rounding (about 1e-4 absolute on
SmolLM2's logits). Left out: GPUs (cuBLAS needs no such step), int8 and fp16 weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

_BATCH_HINT = 32
"""The batch size oneDNN picks the packed layout for; decode batches are 1-64 rows, and a
hint of 32 measured as fast as the exact size at 8 rows and faster at 1 and 32."""


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether packing pays for weights of `dtype` on `device`: float32 on any CPU with
    oneDNN, bfloat16 where the CPU multiplies bf16 in hardware (elsewhere oneDNN
    emulates it)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_linear_pointwise") and hasattr(ops, "_reorder_linear_weight")):
        return False
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        from art_langgraph.runtime.devices import cpu_has_fast_bf16

        return cpu_has_fast_bf16()
    return False


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in) reordered for `torch.ops.mkldnn._linear_pointwise`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _BATCH_HINT)


PACKED_ROWS = 64
"""Up to this many rows, a packed multiply's row count is rounded up to a multiple of
`ROW_BUCKET`; beyond, to one of eight counts an octave (`bucket_rows`, at most 1/8 more
rows), with zero rows. oneDNN builds and keeps a kernel, with its own buffers, for every
row count it meets: fed every count from 1 to 400 (a prefill's, or a fast-forward step's
rows), two of SmolLM2's linear layers grew the process by 718-896 MiB at each call's own
count, and 49 MiB bucketed (bench/results/packed_shapes/packed_shapes.json); unrounded,
the merged copy's counts grew oneDNN's kernels by 74 MiB over one held-out evaluation of a
trained two-hop run (a heap profile, docs/benchmarks.md#engine-memory). Bucketed, a
prefill's rows take 0.48x `F.linear`'s time from 1 to 400 rows and 0.55x from 65 to 4,096
(packed_shapes_prefill.json), so every count goes through one packed multiply; chunks of
64 rows made such a prefill ~7x slower."""
ROW_BUCKET = 8
"""A packed multiply of up to PACKED_ROWS rows is rounded up to a multiple of this, past
SMALL_ROWS."""
SMALL_ROWS = 4
"""Up to this many rows, a packed multiply runs at the next power of two (1, 2 or 4 rows)
instead of ROW_BUCKET: one agent's decode step multiplies one row by every weight, which
oneDNN does as a matrix-vector product at one row and as a whole 8-row product when padded
to 8. On 2 AVX2 cores SmolLM2-135M's linear layers (a decode step's 211 products) took
22-29 ms at 1 row, 25-30 at 2 and 27-35 at 4, against 32-36 ms at 8 (three interleaved
rounds in one process); in two runs of `bench.probes.small_rows` one decode step of one
row of 600 tokens went from 70.8-73.5 to 59.7-59.9 ms (1.18-1.23x), of two rows
1.21-1.22x, of three and four 1.08-1.21x, with 0.99-1.05x for 8 rows, where both arms
multiply the same (bench/results/small_rows/small_rows.json holds the second). The
price: three more kernels a layer shape."""


def bucket_rows(m: int) -> int:
    """The row count a packed multiply of `m` rows runs at: up to SMALL_ROWS, the next
    power of two; up to PACKED_ROWS, a multiple of ROW_BUCKET; beyond, one of eight counts
    an octave (at most 1/8 more rows)."""
    if 0 < m <= SMALL_ROWS:
        return 1 << (m - 1).bit_length()
    if m <= PACKED_ROWS:
        return -(-m // ROW_BUCKET) * ROW_BUCKET
    step = 1 << max(m.bit_length() - 4, 3)
    return -(-m // step) * step


def packed_rows(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`x` (M, in) times the packed weight, M rounded up with zero rows to `bucket_rows(M)`
    (one of few row counts oneDNN keeps a kernel for); returns (M, out)."""
    m = len(x)
    rows = bucket_rows(m)
    if rows != m:  # torch.cat: F.pad took 1.3-1.7x as long past a decode step (probes.pad_rows)
        x = torch.cat([x, x.new_zeros(rows - m, x.shape[1])])
    y = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return y if rows == m else y[:m]


class PackedLinear(torch.nn.Linear):
    """An `nn.Linear` that multiplies by a oneDNN-packed copy of its weight when no
    gradient is wanted (see the module's docstring)."""

    _packed: torch.Tensor | None = None
    _packed_only: bool = False
    """True where the packed copy holds other weights than `weight` (the engine's merged
    copy: base + LoRA packed, `weight` the shared base): no fallback to `weight` then."""

    def pack(self) -> None:
        """(Re)make the packed copy from the weight as it is now."""
        self._packed = packed_weight(self.weight)
        self._packed_only = False

    def set_packed(self, packed: torch.Tensor) -> None:
        """Multiply by `packed` (from `packed_weight`) from now on, whatever `weight` holds:
        the module computes only without gradients, on CPU inputs of the weight's dtype."""
        self._packed = packed
        self._packed_only = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed
        if (
            packed is None
            or torch.is_grad_enabled()
            or x.dtype != packed.dtype
            or self.weight.dtype != packed.dtype  # the module was cast since it was packed
            or x.device.type != "cpu"
        ):
            if self._packed_only:
                raise RuntimeError(
                    "this layer holds its weights only packed for oneDNN: it runs without "
                    f"gradients on CPU {self.weight.dtype} inputs, got {x.dtype} on {x.device}"
                )
            return F.linear(x, self.weight, self.bias)
        y = packed_rows(x.reshape(-1, x.shape[-1]), packed, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def __getstate__(self) -> dict[str, Any]:
        # A copy (copy.deepcopy of the model) starts unpacked: oneDNN tensors do not copy,
        # and the copy's weights are about to change (the engine's merged model).
        state = dict(super().__getstate__())
        state.pop("_packed", None)
        state.pop("_packed_only", None)
        return state


def pack_linears(model: torch.nn.Module, *, missing_only: bool = False) -> int:
    """Pack every plain `nn.Linear` (and repack every `PackedLinear`; with `missing_only`,
    only those without a packed copy) of `model` whose weight can be packed; peft's LoRA
    factors are left as they are. Returns how many."""
    n = 0
    for name, module in model.named_modules():
        if type(module) not in (torch.nn.Linear, PackedLinear) or ".lora_" in f".{name}":
            continue
        if missing_only and isinstance(module, PackedLinear) and module._packed is not None:
            continue
        weight = module.weight
        if weight.is_meta or not can_pack(weight.device, weight.dtype):
            continue
        module.__class__ = PackedLinear
        module.pack()  # type: ignore[operator]
        n += 1
    return n
