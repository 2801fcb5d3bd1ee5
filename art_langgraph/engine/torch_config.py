"""The torch engine's settings: `TorchEngineConfig`, each field documented in place.

Batch size and scheduling, the device and dtype, the memory budgets of the running
batch's KV cache and of the prefix cache, the merged copy of the latest adapter, oneDNN
prepacking on the CPU, and the chat template. The docs' table of these settings
(docs/configuration.md) is written from the field docstrings (`scripts/docs.py`).

Left out: the engine itself (`torch_engine.py`, which re-exports this class) and the
defaults that depend on the device (`engine/budgets.py`, `devices.pick_engine_dtype`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from art_langgraph.errors import UsageError


@dataclass(frozen=True)
class TorchEngineConfig:
    """Settings of the torch engine."""

    max_batch_size: int = 64
    """Most sequences decoded together; more wait in the queue."""
    max_kv_bytes: int | None = None
    """Memory budget of the running batch's KV cache, in bytes: a request waits in the queue
    while admitting it could take the batch past it, counting every row at the batch's
    widest length (rows are left-padded to it), each row's prompt plus its max_tokens (at
    most `_KV_GROWTH` more). One request always runs. None: 1/16 of the device's memory, at
    most 512 MiB on the CPU: SmolLM2-135M in float32 holds 46 KB a token, so ~15 rows of an
    agent's 750-token turns, where a 2-core CPU's decode throughput has stopped growing
    (109 tokens/s at 16 rows, 99 at 32: bench/results/engine_packed/engine_packed.json),
    and a real-model `art-mcp train` run stays under 4 GiB (it took 7.4 GiB with 64 such rows, 4.1 GiB with
    1 GiB of KV); on CUDA 1/4 of its memory. 0: no budget."""
    scheduling: Literal["continuous", "dynamic"] = "continuous"
    """continuous: new requests join the running batch at the next step.
    dynamic: new requests wait until the running batch has finished."""
    device: str | None = None
    """"cuda", "cpu", ...; None picks CUDA when present."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Weights dtype; None: bfloat16 on CUDA; on CPUs that multiply it in hardware (AMX,
    AVX-512-BF16), float32 for a model of at most 270M parameters (counted from its config:
    SmolLM2-135M learned more in float32 there, at 1.2-1.8x the wall time) and bfloat16 for a
    larger one; float32 on other CPUs (`devices.pick_engine_dtype`, `FLOAT32_MAX_PARAMS`)."""
    seed: int = 0
    """Seed of the generator shared by requests that carry no seed."""
    admit_wait_s: float = 0.002
    """When idle, how long to wait for more arrivals before a prefill (seconds)."""
    merge_latest: bool = True
    """Keep a second copy of the weights with the most recently loaded adapter merged in, and
    serve batches that use only that adapter from it: peft's per-layer LoRA path costs about
    2x in decode time on a small model. Costs one more copy of the model's weights in memory."""
    prefix_cache_bytes: int | None = None
    """Memory budget of the prefix cache, in bytes: the KV of earlier requests, kept so a new
    request prefills only what no earlier request under the same weights computed (an
    agent's next turn, a group's shared prompt; see `engine/prefix_cache.py`). Least
    recently used blocks are evicted past it, except those a queued request pinned (the
    chain it will start from). 0 turns the cache off. None: on the CPU 1/64 of the
    machine's RAM, at most 256 MiB: on an untrained 48-scenario evaluation of the two-hop
    org task (144 six-turn episodes in flight, SmolLM2-135M fp32), 256 MiB served 81% of
    the prompt tokens against 84% for 753 MiB (1/32 of 24 GiB), as fast (0.96x the wall
    time) and 470 MiB lower at the peak, before the pins (`bench.engine_memory`,
    docs/benchmarks.md#what-a-waiting-turn-keeps: with them, and the agent's tool lists
    kept whole, a capitals evaluation got 92-93% at 256 MiB);
    on CUDA 1/32 of its memory, at most 1 GiB. A new adapter's step starts from an empty
    cache, as the previous step's KV is dropped with its weights. Negative budgets, and
    budgets beyond the device's memory, are refused at construction."""
    prefix_cache_block_size: int = 16
    """Tokens per prefix-cache block (vLLM's --block-size): a prompt reuses whole blocks, so
    up to this many tokens less than the longest common prefix. At least 1."""
    prepack_weights: bool = True
    """On the CPU, multiply by weights reordered once for oneDNN instead of letting every
    call reorder them (`engine/packed_linear.py`): decode steps of 8-32 rows 1.25-1.66x
    faster on SmolLM2-135M, one row no faster
    (bench/results/engine_packed/engine_packed.json), for one packed copy of each linear
    weight in memory (the merged copy of `merge_latest` holds those of its adapter's layers,
    the base the rest). float32, and bfloat16 where the CPU multiplies it in hardware;
    ignored elsewhere."""
    fast_forward: bool = True
    """Feed the tokens a request's grammar forces (a forced tool call's `{"name": "`, the
    rest of a function name once its prefix is unique) in the forward that follows, a
    run per row, instead of one decode step each: the same tokens and logprobs, fewer
    steps (`GrammarCompiler.forced_run`; SGLang's jump-forward decoding). Requests
    without a grammar, or with stop strings, decode one token a step either way."""
    speculative_tokens: int = 4
    """Speculative decoding by prompt lookup (vLLM's "ngram" method): after each sampled
    token, guess up to this many next tokens from the latest earlier occurrence of the row's
    last tokens in its own prompt and completion, feed them with the next forward, and keep
    those the model's draws keep: a row's tokens and logprobs are the ones a step each would
    give (a seeded row's draws too), in fewer steps where the guesses hold
    (`engine/speculative.py`). Agents copy the user's words and tools' results, and
    untrained models repeat calls. 0 turns it off."""
    prompt_lookup_min: int = 2
    """The shortest run of a row's last tokens looked up for a guess (vLLM's
    `prompt_lookup_min`)."""
    prompt_lookup_max: int = 4
    """The longest run looked up first (vLLM's `prompt_lookup_max`)."""
    batch_head: bool = True
    """Where the rows forming a batch share a prompt head (an agent's system prompt and
    tools: at least 128 tokens, whole prefix-cache blocks), hold its KV once for the batch
    instead of in every row: each forward reads it once for all rows (its attention runs
    in two parts, merged: `engine/batch_head.py`), and the KV budget counts it once, so more
    rows decode together. A row that does not open with the head puts it back into every
    row before it joins. On by default since a whole `art-mcp train` run was measured with
    it: capitals, three seeds on a 2-core AMX host, the evaluations and rollouts took about
    half their time (the untrained evaluation 1.2 min against 1.9, rollouts 0.5 against
    0.9) and a run 0.55x the issue-55 reference's against 0.69x without it, peaking at
    3.30 GiB (docs/benchmarks.md#time-to-rise-head). Before that: a decode step of 64 rows
    of 900 tokens (700 shared) ran 1.69x faster with it, two org-chart evaluations took
    0.92x and 0.84x the time, peaking 0.15 GiB higher, and one RL step's 32 agent rollouts
    ran 1.12-1.69x faster on three pairs (docs/benchmarks.md#batch-head). Models with
    layers that are not full attention
    keep it off."""
    chat_template: str | None = None
    """A Jinja chat template (its text, or a file path) replacing the tokenizer's own, as
    vLLM's --chat-template. None: the tokenizer's template; one that ignores tools gets them
    in the generic format (chat/templates.py)."""

    def __post_init__(self) -> None:
        if self.prefix_cache_bytes is not None and self.prefix_cache_bytes < 0:
            raise UsageError(
                f"prefix_cache_bytes must be >= 0 (0 turns the prefix cache off), "
                f"got {self.prefix_cache_bytes}"
            )
        if self.max_kv_bytes is not None and self.max_kv_bytes < 0:
            raise UsageError(f"max_kv_bytes must be >= 0 (0: no budget), got {self.max_kv_bytes}")
        if self.speculative_tokens < 0 or not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise UsageError(
                "speculative_tokens must be >= 0 and 1 <= prompt_lookup_min <= "
                f"prompt_lookup_max, got {self.speculative_tokens}, {self.prompt_lookup_min}, "
                f"{self.prompt_lookup_max}"
            )
        if self.prefix_cache_block_size < 1:
            raise UsageError(
                f"prefix_cache_block_size must be >= 1, got {self.prefix_cache_block_size}"
            )
