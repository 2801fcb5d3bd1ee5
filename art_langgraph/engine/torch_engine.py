"""The torch engine: transformers + peft, continuous batching, several LoRA adapters.

One worker thread owns the model. Requests from any event loop are queued; at every
step the worker admits new requests (a batched, left-padded prefill whose KV cache is
merged into the running batch), then runs one decode forward for every active
sequence, samples a token per row (each row with its own temperature, top-p, seed,
grammar and adapter), and retires the rows that finished. Rows of one batch may use
different LoRA adapters (peft's mixed-adapter batches). `scheduling="dynamic"` admits
new requests only when the batch has drained, for comparison (see bench/).

Adapter loads and unloads run on the worker thread between two steps, so a swap never
races a forward pass, and an adapter that is replaced is freed only once no running
sequence uses it.

The KV cache grows in place (`engine/kv_cache.py`): a decode step writes one column
instead of copying the whole cache, as transformers' `DynamicCache` does.

A prefix cache (`engine/prefix_cache.py`) keeps the KV of earlier requests across
requests, keyed by the weights they were computed under: an agent's next turn, or a
group member admitted later, prefills only its new tokens (`cached_tokens` in each
result, counters in `metrics()`).

Runs on CUDA when present (bf16) and on the CPU otherwise (bf16 where the CPU multiplies
it in hardware, else fp32: `devices.pick_engine_dtype`); on the CPU the linear layers
multiply by weights prepacked for oneDNN (`engine/packed_linear.py`). Left out: paged
attention and chunked prefill; vLLM is the engine for those.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from art_langgraph.devices import pick_device, pick_engine_dtype, torch_dtype
from art_langgraph.engine.base import EngineMetrics, GenerateResult, SamplingParams, TokenEvent
from art_langgraph.engine.constrained import GrammarCompiler
from art_langgraph.engine.kv_cache import (
    drop_left,
    fill_rows,
    growing_cache,
    merge_rows,
    preset_layer,
)
from art_langgraph.engine.packed_linear import PackedLinear, can_pack, pack_linears, packed_weight
from art_langgraph.engine.prefix_cache import PrefixCache, PrefixHit
from art_langgraph.engine.sampling import raw_logprobs, sample_rows
from art_langgraph.errors import InfrastructureError, UsageError
from art_langgraph.heap import release_free_memory, use_mmap_for_large_blocks

__all__ = ["TorchEngine", "TorchEngineConfig"]

log = logging.getLogger(__name__)

_BASE = "__base__"  # peft's name for "no adapter" in a mixed batch


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
    (109 tokens/s at 16 rows, 99 at 32: bench/results/engine_packed.json), and a real-model
    `art-mcp train` run stays under 4 GiB (it took 7.4 GiB with 64 such rows, 4.1 GiB with
    1 GiB of KV); on CUDA 1/4 of its memory. 0: no budget."""
    scheduling: Literal["continuous", "dynamic"] = "continuous"
    """continuous: new requests join the running batch at the next step.
    dynamic: new requests wait until the running batch has finished."""
    device: str | None = None
    """"cuda", "cpu", ...; None picks CUDA when present."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Weights dtype; None: bfloat16 on CUDA and on CPUs that multiply it in hardware (AMX,
    AVX-512-BF16), float32 on other CPUs (`devices.pick_engine_dtype`)."""
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
    recently used blocks are evicted past it. 0 turns the cache off. None: 1/32 of the
    device's memory (the machine's RAM on CPUs), at most 1 GiB: one RL step's rollouts on
    SmolLM2-135M (16 agents, 4 turns, fp32) held 608 MiB, and a new adapter's step starts
    from an empty cache, as the previous step's KV is dropped with its weights. Negative budgets, and
    budgets beyond the device's memory, are refused at construction."""
    prefix_cache_block_size: int = 16
    """Tokens per prefix-cache block (vLLM's --block-size): a prompt reuses whole blocks, so
    up to this many tokens less than the longest common prefix. At least 1."""
    prepack_weights: bool = True
    """On the CPU, multiply by weights reordered once for oneDNN instead of letting every
    call reorder them (`engine/packed_linear.py`): decode steps of 8-32 rows 1.25-1.66x
    faster on SmolLM2-135M, one row no faster (bench/results/engine_packed.json), for one
    packed copy of each linear weight in memory (the merged copy of `merge_latest` holds
    those of its adapter's layers, the base the rest). float32, and bfloat16 where the CPU
    multiplies it in hardware; ignored elsewhere."""
    chat_template: str | None = None
    """A Jinja chat template (its text, or a file path) replacing the tokenizer's own, as
    vLLM's --chat-template. None: the tokenizer's template; one that ignores tools gets them
    in the generic format (engine/templates.py)."""

    def __post_init__(self) -> None:
        if self.prefix_cache_bytes is not None and self.prefix_cache_bytes < 0:
            raise UsageError(
                f"prefix_cache_bytes must be >= 0 (0 turns the prefix cache off), "
                f"got {self.prefix_cache_bytes}"
            )
        if self.max_kv_bytes is not None and self.max_kv_bytes < 0:
            raise UsageError(f"max_kv_bytes must be >= 0 (0: no budget), got {self.max_kv_bytes}")
        if self.prefix_cache_block_size < 1:
            raise UsageError(
                f"prefix_cache_block_size must be >= 1, got {self.prefix_cache_block_size}"
            )


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    adapter_name: str | None
    adapter_key: str
    emit: Callable[[TokenEvent | GenerateResult | BaseException], None]
    stream: bool
    generator: torch.Generator | None = None
    matcher: Any = None
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] | None = None
    cancelled: bool = False
    identity: str = ""
    """The weights identity the KV was computed under (prefix-cache key), set at admission."""
    cached: int = 0
    """Prompt tokens served from the prefix cache."""
    t_submit: float = field(default_factory=time.perf_counter)
    t_start: float = 0.0
    t_first: float = 0.0


class TorchEngine:
    """An `InferenceEngine` on transformers + peft. Build it with `from_pretrained`."""

    def __init__(self, model: Any, tokenizer: Any, config: TorchEngineConfig | None = None) -> None:
        self.config = config or TorchEngineConfig()
        self.tokenizer = tokenizer
        self.base_model = model
        self.model = model  # becomes a PeftModel with the first adapter
        self._cache_kw = _cache_keyword(model)
        self.device = next(model.parameters()).device
        from art_langgraph.engine.shared_base import SharedBase, frozen_tensors

        self.shared_base = SharedBase(
            frozen_tensors(model), model, next(model.parameters()).dtype, self.device
        )
        """The frozen weights, as loaded: a trainer in this process trains over them (one copy)."""
        if self.device.type == "cpu":
            use_mmap_for_large_blocks()  # KV blocks go back to the OS when freed (heap.py)
            # Masked prefill and batched decode read each key/value head for its query heads
            # in SDPA (`enable_gqa`, which torch's CPU kernel supports with a mask) instead of
            # transformers' `repeat_kv` copies: transformers enables it on the CPU only
            # without a mask, unless this switch is set. The same attention, no copies.
            os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")
        if self.config.prepack_weights:
            pack_linears(model)
        self.context_length = int(
            getattr(model.config, "max_position_embeddings", None) or tokenizer.model_max_length
        )
        self.vocab_size = int(model.config.vocab_size)
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(int(i) for i in eos_ids)
        self._eos_index = torch.tensor(sorted(self.eos_token_ids), dtype=torch.long).unsqueeze(
            0
        )  # (1, E)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else next(iter(self.eos_token_ids), 0))
        self.grammars = GrammarCompiler(tokenizer, self.vocab_size)
        self._adapters: dict[str, str] = {}  # user name -> peft key
        self._retired: set[str] = set()  # peft keys to delete once unused
        self._spare: str | None = None  # one unused peft key kept to load the next adapter into
        self._merged: Any = None  # plain model with one adapter merged in (merge_latest)
        self._merged_key: str | None = None
        self._keys = itertools.count(1)
        self._generator = torch.Generator(device="cpu").manual_seed(self.config.seed)
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._held: _Request | None = None
        """The oldest request that did not fit the batch: it is the next one admitted, ahead
        of everything in the inbox (re-queued at the back, it could wait behind later and
        smaller requests for as long as they keep coming)."""
        self._closing = False
        self.admitted_in_place = 0
        """Rows admitted into free slots of a running batch (no copy of the others)."""
        self._rows: list[_Request | None] = []
        """The batch's row slots: a request, or None where one retired and the slot waits
        for a new row (its KV stays, masked out) until the batch is compacted."""
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # (B, T) 1 for real tokens
        self._next: torch.Tensor | None = None  # (B,) token to feed next
        self._pos: torch.Tensor | None = None  # (B,) its position
        self.steps = 0
        """Decode steps run so far (for tests and metrics)."""
        self.shared_prefix_tokens = 0
        """Prompt tokens not prefilled because a batch shared them (for tests and metrics)."""
        self._kv_token_bytes = _kv_token_bytes(model.config, next(model.parameters()).dtype)
        self._kv_budget = _kv_budget(self.config.max_kv_bytes, self.device)
        self._prefix = PrefixCache(
            _prefix_budget(self.config.prefix_cache_bytes, self.device),
            self.config.prefix_cache_block_size,
        )
        if self._prefix.enabled and not _full_attention_only(model.config):
            log.info("prefix cache off: the model has layers that are not full attention")
            self._prefix = PrefixCache(0, self.config.prefix_cache_block_size)
        self._identity: dict[str, str] = {_BASE: _BASE}  # peft key -> weights identity
        self._loads = itertools.count(1)
        self._counts = EngineMetrics(prefix_cache_capacity_bytes=self._prefix.budget_bytes)
        self._thread = threading.Thread(target=self._run, name="art-torch-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ build
    @classmethod
    def from_pretrained(
        cls, base_model: str, config: TorchEngineConfig | None = None, cache_dir: Path | None = None
    ) -> TorchEngine:
        """Load a HF id, a local folder, a `.gguf` file, or a preset (`"tiny"`, `"smollm2-135m"`)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from art_langgraph.presets import resolve_preset

        config = config or TorchEngineConfig()
        path = resolve_preset(base_model, cache_dir)
        device = pick_device(config.device)
        dtype_name = pick_engine_dtype(config.dtype, device)
        hf_logging.disable_progress_bar()
        tokenizer = AutoTokenizer.from_pretrained(path)
        if config.chat_template is not None:
            from art_langgraph.engine.templates import load_chat_template

            tokenizer.chat_template = load_chat_template(config.chat_template)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype_name))
        model = model.to(device).eval()  # type: ignore[arg-type]
        engine = cls(model, tokenizer, config)
        engine.model_path = path
        return engine

    model_path: str = ""
    """The folder or id the weights came from."""

    # ---------------------------------------------------------------- public
    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None = None
    ) -> GenerateResult:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[GenerateResult] = loop.create_future()

        def emit(item: TokenEvent | GenerateResult | BaseException) -> None:
            if isinstance(item, TokenEvent):
                return
            _post(loop, _settle, fut, item)

        req = self._submit(prompt_ids, sampling, adapter, emit, stream=False)
        try:
            return await fut
        except asyncio.CancelledError:
            req.cancelled = True
            raise

    async def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None = None
    ) -> AsyncIterator[TokenEvent | GenerateResult]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[TokenEvent | GenerateResult | BaseException] = asyncio.Queue()

        def emit(item: TokenEvent | GenerateResult | BaseException) -> None:
            _post(loop, q.put_nowait, item)

        req = self._submit(prompt_ids, sampling, adapter, emit, stream=True)
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, GenerateResult):
                    return
        finally:
            req.cancelled = True

    async def load_adapter(self, name: str, path: str) -> None:
        if not (Path(path) / "adapter_config.json").is_file():
            raise UsageError(f"{path!r} is not a peft adapter folder (no adapter_config.json)")
        await self._command(lambda: self._load_adapter(name, path))

    async def unload_adapter(self, name: str) -> None:
        await self._command(lambda: self._unload_adapter(name))

    def list_adapters(self) -> list[str]:
        return sorted(self._adapters)

    def metrics(self) -> EngineMetrics:
        c = self._counts
        return EngineMetrics(
            prompt_tokens=c.prompt_tokens,
            generation_tokens=c.generation_tokens,
            prefix_cache_queries=c.prefix_cache_queries,
            prefix_cache_hits=c.prefix_cache_hits,
            prefix_cache_evictions=self._prefix.evictions,
            prefix_cache_bytes=self._prefix.bytes,
            prefix_cache_capacity_bytes=self._prefix.budget_bytes,
            running=self.active,
            waiting=self._inbox.qsize() + (self._held is not None),
        )

    async def drop_prefix_cache(self) -> None:
        """Empty the prefix cache now (a training step is about to replace the weights its
        KV was computed under, and nothing is served meanwhile): its memory goes to the
        trainer instead of waiting for the swap."""
        await self._command(self._prefix.clear)

    @property
    def prefix_cache(self) -> PrefixCache:
        """The prefix cache (for tests and benchmarks; the worker thread owns it)."""
        return self._prefix

    async def close(self) -> None:
        self._closing = True
        self._inbox.put(None)
        await asyncio.to_thread(self._thread.join, 30)

    def close_sync(self) -> None:
        self._closing = True
        self._inbox.put(None)
        self._thread.join(30)

    @property
    def active(self) -> int:
        """Sequences being decoded now."""
        return sum(r is not None for r in self._rows)

    def _live(self) -> list[_Request]:
        return [r for r in self._rows if r is not None]

    # ------------------------------------------------------------- internals
    def _submit(self, prompt_ids, sampling, adapter, emit, *, stream) -> _Request:
        if self._closing:
            raise InfrastructureError("the engine is closed")
        prompt = [int(i) for i in prompt_ids]
        if not prompt:
            raise UsageError("the prompt is empty")
        if max(prompt) >= self.vocab_size or min(prompt) < 0:
            raise UsageError(f"prompt token ids must be in [0, {self.vocab_size})")
        if len(prompt) >= self.context_length:
            from art_langgraph.errors import ContextLengthError

            raise ContextLengthError(len(prompt), None, self.context_length)
        key = _BASE
        if adapter is not None:
            if adapter not in self._adapters:
                raise UsageError(
                    f"no adapter named {adapter!r} is loaded; loaded: {self.list_adapters()}"
                )
            key = self._adapters[adapter]
        req = _Request(prompt, sampling, adapter, key, emit, stream)
        if sampling.seed is not None:
            req.generator = torch.Generator(device="cpu").manual_seed(sampling.seed)
        if sampling.grammar is not None:
            req.matcher = self.grammars.matcher(sampling.grammar)
        self._inbox.put(req)
        return req

    async def _command(self, fn: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def done(result: Any) -> None:
            _post(loop, _settle, fut, result)

        self._inbox.put(("cmd", fn, done))
        await fut

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        try:
            self.grammars.warm_up()
        except Exception:  # constrained requests will report their own errors
            log.exception("grammar warm-up failed")
        while not self._closing:
            new: list[_Request] = []
            try:
                new = self._take_inbox(block=not self.active)
                if new:
                    self._prefill(new)
                if self._rows:
                    self._decode()
                self._free_retired()
            except Exception as exc:  # a bug or an OOM: fail the batch, keep serving
                log.exception("engine step failed")
                failed = {id(r): r for r in [*self._live(), *new]}
                for r in failed.values():
                    r.emit(InfrastructureError(f"engine step failed: {exc!r}"))
                self._reset_batch()
        for r in [*self._live(), *([self._held] if self._held else [])]:
            r.emit(self._result(r, "abort"))
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if isinstance(item, _Request):
                item.emit(self._result(item, "abort"))

    def _take_inbox(self, *, block: bool) -> list[_Request]:
        new: list[_Request] = []
        room = self.config.max_batch_size - self.active
        if self.config.scheduling == "dynamic" and self.active:
            room = 0
        running = self._live()
        width = max((self._kv_width(r) for r in running), default=0)
        deadline = None
        while True:
            if self._held is not None:
                item, self._held = self._held, None
            else:
                try:
                    if block and not new:
                        item = self._inbox.get(timeout=0.5)
                    elif deadline is not None:
                        item = self._inbox.get(timeout=max(0.0, deadline - time.perf_counter()))
                    else:
                        item = self._inbox.get_nowait()
                except queue.Empty:
                    if block and not new and not self._closing:
                        continue
                    break
            if item is None:
                break
            if isinstance(item, tuple):
                _, fn, done = item
                try:
                    fn()
                    done(None)
                except Exception as exc:
                    done(exc)
                continue
            if item.cancelled:
                continue
            rows = len(running) + len(new) + 1
            wide = max(width, self._kv_width(item))
            if room <= len(new) or (
                # The KV budget (TorchEngineConfig.max_kv_bytes): every row counted at the
                # widest row; the first request of an empty batch always runs.
                self._kv_budget
                and rows > 1
                and rows * wide * self._kv_token_bytes > self._kv_budget
            ):
                self._held = item  # no room: it is the first to join at a later step
                break
            width = wide
            item.t_start = time.perf_counter()
            new.append(item)
            if block and deadline is None:
                deadline = time.perf_counter() + self.config.admit_wait_s
        return new

    @staticmethod
    def _kv_width(r: _Request) -> int:
        """The most tokens of KV row `r` can come to hold: its prompt and completion so far,
        and what it may still sample (at most `_KV_GROWTH` counted)."""
        done = len(r.prompt_ids) + len(r.completion)
        left = (r.sampling.max_tokens or _KV_GROWTH) - len(r.completion)
        return done + max(0, min(left, _KV_GROWTH))

    def _forward(self, input_ids, mask, pos, cache, keys: list[str]) -> torch.Tensor:
        kwargs: dict[str, Any] = {}
        scope: Any = contextlib.nullcontext()
        model = self.model
        if self.model is not self.base_model:
            unique = set(keys)
            if self._merged_key is not None and unique == {self._merged_key}:
                model = self._merged
            elif unique == {_BASE}:
                scope = self.model.disable_adapter()
            elif len(unique) == 1:
                # One adapter for the whole batch: peft's plain path is ~1.7x faster than its
                # mixed-batch path (measured on the tiny preset, 32 rows).
                (key,) = unique
                if self.model.active_adapter != key:
                    self.model.set_adapter(key)
            else:
                kwargs["adapter_names"] = keys
        t = cache.get_seq_length()
        q = input_ids.shape[1]
        with scope:
            out = model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=pos,
                **{self._cache_kw: cache},
                cache_position=torch.arange(t, t + q, device=self.device),
                use_cache=True,
                logits_to_keep=1,
                **kwargs,
            )
        return out.logits[:, -1, :]  # (B, V)

    def _prefill(self, new: list[_Request]) -> None:
        """Prefill the new rows. Each row starts from the longest prefix of its prompt that
        the prefix cache holds under its weights. Where rows of one adapter share a longer
        prompt prefix (a group's system prompt and first turn), that head runs once and
        every such row starts from it. The rest of each prompt then runs left-padded after
        its start, so the row layout is [pads | start | pads | suffix] with the pads masked
        out and positions continuing."""
        pc = self._prefix
        starts: list[_Start] = []
        for r in new:
            # A key retired while the request queued has no identity: share nothing.
            r.identity = self._identity.get(r.adapter_key) or f"orphan.{next(self._loads)}"
            hit = pc.lookup(r.identity, r.prompt_ids, len(r.prompt_ids) - 1)
            r.cached = hit.tokens
            starts.append(_Start(hit.tokens, hit=hit))
            self._counts.prompt_tokens += len(r.prompt_ids)
            self._counts.prefix_cache_queries += len(r.prompt_ids)
            self._counts.prefix_cache_hits += hit.tokens
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(new):
            groups.setdefault(r.adapter_key, []).append(i)
        for idx in groups.values():
            rows = [new[i] for i in idx]
            shared = _shared_prefix(rows)
            if shared - max(starts[i].tokens for i in idx) < _MIN_SHARED_PREFIX:
                continue
            head = rows[0].prompt_ids[:shared]
            hit = pc.lookup(rows[0].identity, head, shared - 1)
            cache, mask, _, _ = self._prefill_rows([head], [_Start(hit.tokens, hit=hit)], [rows[0]])
            layers = [(layer.keys, layer.values) for layer in cache.layers]  # (1, H, P, D)
            for i in idx:
                starts[i] = _Start(shared, head=layers)
            self.shared_prefix_tokens += shared * (len(idx) - 1)
        cache, mask, pos, logits = self._prefill_rows([r.prompt_ids for r in new], starts, new)
        now = time.perf_counter()
        for r in new:
            r.t_first = now
        tokens = self._sample(new, logits)
        nxt = tokens.to(self.device)
        last = pos[:, -1] + 1
        self._merge(new, cache, mask, nxt, last)
        self._retire_finished()

    def _prefill_rows(
        self, prompts: list[list[int]], starts: list[_Start], rows: list[_Request]
    ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One prefill forward of `prompts`, each row after its start's KV; every full block
        of each prompt goes into the prefix cache. Returns the cache, the (B, T) mask, the
        (B, S) positions of the suffix and the (B, V) logits of each row's last token."""
        b = len(prompts)
        width = max(s.tokens for s in starts)
        cache = growing_cache(self.model.config)
        mask_start = torch.zeros((b, width), dtype=torch.long)
        suffix = max(len(p) - s.tokens for p, s in zip(prompts, starts, strict=True))
        if width:
            self._fill_starts(cache, starts, width, suffix)
            for i, st in enumerate(starts):
                mask_start[i, width - st.tokens :] = 1
        ids = torch.full((b, suffix), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((b, suffix), dtype=torch.long)
        for i, (p, st) in enumerate(zip(prompts, starts, strict=True)):
            n = len(p) - st.tokens
            ids[i, suffix - n :] = torch.tensor(p[st.tokens :])
            mask[i, suffix - n :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        offset = torch.tensor([s.tokens for s in starts], device=self.device)[:, None]
        pos = offset + (mask.cumsum(-1) - 1).clamp(min=0)  # (B, S)
        mask = torch.cat([mask_start.to(self.device), mask], 1)  # (B, T)
        logits = self._forward(ids, mask, pos, cache, [r.adapter_key for r in rows])
        if self._prefix.enabled:
            for i, (p, r) in enumerate(zip(prompts, rows, strict=True)):
                self._remember(cache, i, mask[i], p, r.identity)
        return cache, mask, pos, logits

    def _fill_starts(self, cache: Any, starts: list[_Start], width: int, suffix: int) -> None:
        """Give each layer of `cache` a (B, H, width + room, D) buffer whose first `width`
        steps hold each row's start, right-aligned (zeros before it)."""
        b = len(starts)
        st0 = next(s for s in starts if s.head is not None or (s.hit is not None and s.hit.blocks))
        if st0.head is not None:
            some = st0.head[0][0]  # (1, H, P, D)
            h, d, dtype = some.shape[1], some.shape[-1], some.dtype
        else:
            assert st0.hit is not None
            some = st0.hit.blocks[0].kv  # (L, 2, H, bs, D)
            h, d, dtype = some.shape[2], some.shape[-1], some.dtype
        room = suffix + max(64, (width + suffix) // 4)
        bs = self._prefix.block_size
        layer: Any
        for li, layer in enumerate(cache.layers):
            # A prefix hit is gathered one layer at a time, never whole: stacking every row's
            # hit across all layers first held 620 MB for 30 rows of a 450-token hit.
            buf_k = torch.zeros((b, h, width + room, d), dtype=dtype, device=self.device)
            buf_v = torch.zeros_like(buf_k)
            for i, st in enumerate(starts):
                lo = width - st.tokens
                if st.head is not None:
                    buf_k[i, :, lo:width] = st.head[li][0][0]
                    buf_v[i, :, lo:width] = st.head[li][1][0]
                elif st.hit is not None and st.hit.blocks:
                    # this layer of the hit's blocks, (k, 2, H, bs, D): one layer, one row
                    kv = torch.stack([block.kv[li] for block in st.hit.blocks])
                    k = kv.shape[0]
                    buf_k[i, :, lo:width].view(h, k, bs, d).copy_(kv[:, 0].transpose(0, 1))
                    buf_v[i, :, lo:width].view(h, k, bs, d).copy_(kv[:, 1].transpose(0, 1))
            preset_layer(layer, buf_k, buf_v, width)

    def _remember(
        self, cache: Any, row: int, mask: torch.Tensor, tokens: list[int], identity: str
    ) -> None:
        """Put the full blocks of `tokens` (row `row` of `cache`, its real columns where
        `mask` is 1) into the prefix cache."""
        columns = mask.nonzero().squeeze(1)
        if len(columns) != len(tokens):  # never expected; a wrong key would be worse
            log.warning("prefix cache: %d columns for %d tokens", len(columns), len(tokens))
            return
        layers = [(layer.keys[row], layer.values[row]) for layer in cache.layers]
        self._prefix.insert(identity, tokens, layers, columns)

    def _decode(self) -> None:
        assert self._mask is not None and self._next is not None and self._pos is not None
        b = len(self._rows)
        self._mask = torch.cat(
            [self._mask, torch.ones((b, 1), dtype=torch.long, device=self.device)], 1
        )
        live = [i for i, r in enumerate(self._rows) if r is not None]
        rows = [self._rows[i] for i in live]
        # A free slot runs along with the key of a live row (one adapter stays one batch);
        # its output is dropped.
        fill = rows[0].adapter_key  # type: ignore[union-attr]
        logits = self._forward(
            self._next.unsqueeze(1),
            self._mask,
            self._pos.unsqueeze(1),
            self._cache,
            [r.adapter_key if r is not None else fill for r in self._rows],
        )
        if len(live) < b:
            idx = torch.tensor(live, device=self.device)
            self._next = self._next.clone()
            self._next[idx] = self._sample(rows, logits[idx]).to(self.device)  # type: ignore[arg-type]
        else:
            self._next = self._sample(rows, logits).to(self.device)  # type: ignore[arg-type]
        self._pos = self._pos + 1
        self.steps += 1
        self._retire_finished()

    def _sample(self, rows: list[_Request], logits: torch.Tensor) -> torch.Tensor:
        """Pick one token per row, record it and its logprob; returns (B,) ids on the CPU."""
        logits = logits.float()
        lp = raw_logprobs(logits)  # (B, V), before grammar masks
        constrained = [(i, r.matcher) for i, r in enumerate(rows) if r.matcher is not None]
        no_eos = [i for i, r in enumerate(rows) if r.sampling.ignore_eos]
        if no_eos:
            logits[torch.tensor(no_eos).unsqueeze(1), self._eos_index] = float("-inf")
        if constrained:
            bitmask = self.grammars.allocate_bitmask(len(constrained))
            self.grammars.mask_logits(logits, constrained, bitmask)
        temp = torch.tensor([r.sampling.temperature for r in rows], device=logits.device)
        top_p = torch.tensor([r.sampling.top_p for r in rows], device=logits.device)
        tokens = sample_rows(logits, temp, top_p, [r.generator for r in rows], self._generator)
        chosen = lp.gather(1, tokens.unsqueeze(1)).squeeze(1)  # (B,)
        tokens = tokens.cpu()
        tok_list, lp_list = tokens.tolist(), chosen.tolist()
        self._counts.generation_tokens += len(tok_list)
        k = max(r.sampling.top_logprobs for r in rows)
        top_v = top_i = None
        if k:
            top_v, top_i = (t.cpu() for t in lp.topk(k, dim=-1))
        for i, r in enumerate(rows):
            tok, logprob = tok_list[i], lp_list[i]
            r.completion.append(tok)
            r.logprobs.append(logprob)
            top = None
            if r.sampling.top_logprobs and top_v is not None and top_i is not None:
                n = r.sampling.top_logprobs
                top = list(zip(top_i[i, :n].tolist(), top_v[i, :n].tolist(), strict=True))
                r.top = r.top if r.top is not None else []
                r.top.append(top)
            matcher = r.matcher
            if matcher is not None and not matcher.is_stopped() and not matcher.consume_token(tok):
                log.warning("grammar rejected token %d: %s", tok, r.matcher.get_error())
            if r.stream:
                r.emit(TokenEvent(tok, logprob, top))
        return tokens

    def _finish_reason(self, r: _Request) -> tuple[str, str | int | None] | None:
        if r.cancelled:
            return "abort", None
        tok = r.completion[-1]
        s = r.sampling
        if not s.ignore_eos and tok in self.eos_token_ids:
            return "stop", tok
        if tok in s.stop_token_ids:
            return "stop", tok
        if s.stop:
            longest = max(len(x) for x in s.stop)
            tail = self.tokenizer.decode(r.completion[-(longest + 4) :], skip_special_tokens=True)
            for x in s.stop:
                if x in tail:
                    return "stop", x
        if r.matcher is not None and r.matcher.is_stopped():
            return "stop", None
        if len(r.completion) >= s.max_tokens:
            return "length", None
        if len(r.prompt_ids) + len(r.completion) >= self.context_length:
            return "length", None
        return None

    def _result(self, r: _Request, reason: str, stop: str | int | None = None) -> GenerateResult:
        now = time.perf_counter()
        return GenerateResult(
            prompt_token_ids=r.prompt_ids,
            completion_token_ids=list(r.completion),
            logprobs=list(r.logprobs),
            finish_reason=reason,  # type: ignore[arg-type]
            stop_reason=stop,
            top_logprobs=r.top,
            adapter=r.adapter_name,
            cached_tokens=r.cached,
            timings={
                "queued_s": max(0.0, r.t_start - r.t_submit),
                "prefill_s": max(0.0, r.t_first - r.t_start),
                "decode_s": max(0.0, now - r.t_first),
            },
        )

    def _retire_finished(self) -> None:
        """Emit the rows that finished and free their slots. A freed slot keeps its place
        (its mask row zeroed) for the next admitted row, so retiring copies nothing; the
        batch is compacted only once free slots outnumber live rows."""
        assert self._mask is not None
        retired = False
        for i, r in enumerate(self._rows):
            if r is None:
                continue
            done = self._finish_reason(r)
            if done is None:
                continue
            if self._prefix.enabled and len(r.completion) > 1:
                self._remember(
                    self._cache, i, self._mask[i], r.prompt_ids + r.completion[:-1], r.identity
                )
            r.emit(self._result(r, done[0], done[1]))
            self._rows[i] = None
            self._mask[i] = 0
            retired = True
        if not retired:
            return
        live = self.active
        if live == 0:
            self._reset_batch()
        elif 2 * live < len(self._rows):
            self._compact()
        else:
            self._drop_unused_columns()

    def _compact(self) -> None:
        """Drop the free slots from the batch (one copy of the live rows' KV)."""
        keep = [i for i, r in enumerate(self._rows) if r is not None]
        idx = torch.tensor(keep, device=self.device)
        self._rows = [self._rows[i] for i in keep]
        self._cache.batch_select_indices(idx)
        assert self._mask is not None and self._next is not None and self._pos is not None
        self._mask, self._next, self._pos = self._mask[idx], self._next[idx], self._pos[idx]
        self._drop_unused_columns()

    def _drop_unused_columns(self) -> None:
        """Drop the left columns that no live row uses (a view, no copy)."""
        assert self._mask is not None
        used = self._mask.any(dim=0).nonzero()
        lead = int(used[0]) if len(used) else 0
        if lead:
            self._mask = self._mask[:, lead:]
            drop_left(self._cache, lead)

    def _merge(self, new: list[_Request], cache: Any, mask: torch.Tensor, nxt, pos) -> None:
        """Add the prefilled rows to the batch: into free slots in place when there are
        enough and the rows fit the batch's width (a copy of the new rows only), else by
        rebuilding the batch's buffers with them appended (a copy of every row)."""
        if not self.active:
            self._rows, self._cache, self._mask, self._next, self._pos = (
                list(new),
                cache,
                mask,
                nxt,
                pos,
            )
            return
        assert self._mask is not None and self._next is not None and self._pos is not None
        t_old, t_new = self._mask.shape[1], mask.shape[1]
        free = [i for i, r in enumerate(self._rows) if r is None]
        if len(free) >= len(new) and t_new <= t_old and fill_rows(self._cache, cache, free, t_old):
            slots = torch.tensor(free[: len(new)], device=self.device)
            self._mask[slots] = _pad_left_2d(mask, t_old)
            self._next = self._next.clone()
            self._next[slots], self._pos[slots] = nxt, pos
            for slot, r in zip(free, new, strict=False):
                self._rows[slot] = r
            self.admitted_in_place += len(new)
            return
        if free:
            self._compact()
            t_old = self._mask.shape[1]
        width = max(t_old, t_new)
        merge_rows(self._cache, cache, width)
        self._mask = torch.cat([_pad_left_2d(self._mask, width), _pad_left_2d(mask, width)], 0)
        self._next = torch.cat([self._next, nxt])
        self._pos = torch.cat([self._pos, pos])
        self._rows = self._rows + list(new)

    def _reset_batch(self) -> None:
        self._rows, self._cache, self._mask, self._next, self._pos = [], None, None, None, None
        release_free_memory()  # the KV cache's blocks, back to the OS (heap.py)

    # ---------------------------------------------------------------- adapters
    def _load_adapter(self, name: str, path: str) -> None:
        from peft import PeftModel

        tensors = _check_adapter_fits(self.base_model, name, path)
        key = self._load_into_spare(path, tensors) if tensors is not None else None
        if key is not None:
            self._install(name, key)
            return
        key = f"a{next(self._keys)}"
        try:
            if self.model is self.base_model:
                self.model = PeftModel.from_pretrained(self.base_model, path, adapter_name=key)
                self.model.eval()
            else:
                # low_cpu_mem_usage: the new LoRA weights start on the meta device instead of
                # being initialised only to be overwritten (a third of the load time).
                self.model.load_adapter(
                    path, adapter_name=key, is_trainable=False, low_cpu_mem_usage=True
                )
        except (RuntimeError, ValueError, KeyError) as exc:
            if self.model is not self.base_model and key in self.model.peft_config:
                self._delete_keys([key])
            raise UsageError(f"cannot load adapter {name!r} from {path}: {exc}") from exc
        self._install(name, key)

    def _install(self, name: str, key: str) -> None:
        # New weights under `key`: a new identity, so no KV computed before is served.
        if key in self._identity:
            self._prefix.retire(self._identity[key])
        self._identity[key] = f"{key}.{next(self._loads)}"
        old = self._adapters.get(name)
        self._adapters[name] = key
        if old is not None:
            self._retired.add(old)
        if self.config.merge_latest:
            self._merge_adapter(key)

    def _load_into_spare(self, path: str, tensors: dict[str, torch.Tensor]) -> str | None:
        """Write the adapter at `path` (its `tensors`, as `_check_adapter_fits` read them)
        into the spare key's LoRA weights, in place, and return that key; None (nothing
        changed) when there is no spare or the adapter's settings or tensors differ from the
        spare's. Creating a key costs peft a new module per target layer (about 0.35 s on
        SmolLM2); a step's new adapter usually replaces one just freed."""
        key = self._spare
        if key is None:
            return None
        from peft import LoraConfig

        try:
            config = LoraConfig.from_pretrained(path)
        except Exception:
            return None
        have = self.model.peft_config[key]
        same = ("r", "lora_alpha", "target_modules", "use_dora", "use_rslora", "fan_in_fan_out")
        if any(getattr(config, k) != getattr(have, k) for k in same):
            return None
        modules = dict(self.model.named_modules())
        targets: list[tuple[torch.Tensor, torch.Tensor]] = []
        for k, v in tensors.items():
            mod_name, _, part = k.partition(".lora_")
            layers = getattr(modules.get(mod_name), f"lora_{part[:1]}", None)
            if part not in ("A.weight", "B.weight") or layers is None or key not in layers:
                return None
            weight = layers[key].weight
            if weight.shape != v.shape:
                return None
            targets.append((weight, v))
        if len(targets) != sum(key in getattr(m, "lora_A", {}) for m in modules.values()) * 2:
            return None  # not every layer of the spare would be written
        with torch.no_grad():
            for weight, v in targets:
                weight.copy_(v)
        self._spare = None
        return key

    def _merge_adapter(self, key: str) -> None:
        """Make `self._merged` the base weights plus adapter `key` (see `merge_latest`)."""
        from peft.tuners.lora.layer import LoraLayer

        lora = {
            name.removeprefix("base_model.model."): module
            for name, module in self.model.named_modules()
            if isinstance(module, LoraLayer) and key in module.lora_A
        }
        if self._packs():
            self._merge_packed(key, lora)
        elif self._merged is None:
            import copy

            self._merged = copy.deepcopy(self.model).merge_and_unload(adapter_names=[key]).eval()
        else:
            for name, module in lora.items():
                _merge_into(self._merged.get_submodule(name).weight, module, key)
        self._merged_key = key

    def _packs(self) -> bool:
        """Whether the engine's linear layers multiply by packed weights (`prepack_weights`)."""
        return self.config.prepack_weights and can_pack(self.device, self.shared_base.dtype)

    def _merge_packed(self, key: str, lora: dict[str, Any]) -> None:
        """The merged copy without a dense copy of the weights: a module tree over the base's
        tensors (`model_over`, no copy) whose layers adapter `key` targets multiply by packed
        base + LoRA weights (each merged weight a temporary), the others by the base's own
        packed copies. The base gives up its packed copies of the targeted layers (the
        merged copy serves their adapter; batches of the base or of several adapters run
        them through `F.linear`) until the merged copy is dropped: one packed copy of each
        layer in memory, not two."""
        from art_langgraph.engine.shared_base import model_over

        if self._merged is None:
            self._merged = model_over(self.shared_base.tensors, self.base_model).eval()
        base = dict(self.base_model.named_modules())
        for name, module in self._merged.named_modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            own = base.get(f"{name}.base_layer", base.get(name))
            assert own is not None, name  # the same architecture (model_over checked it)
            if name in lora:
                merged = _merged_weight(own.weight, lora[name], key)
                module.__class__ = PackedLinear
                module.set_packed(packed_weight(merged))  # type: ignore[operator]
                del merged
                if isinstance(own, PackedLinear):
                    own._packed = None
            elif isinstance(own, PackedLinear) and own._packed is not None:
                module.__class__ = PackedLinear
                module.set_packed(own._packed)  # type: ignore[operator]
            elif isinstance(module, PackedLinear):  # a target of an earlier adapter only
                module._packed, module._packed_only = None, False  # the base's weight, unpacked

    def _unload_adapter(self, name: str) -> None:
        if name not in self._adapters:
            raise UsageError(f"no adapter named {name!r} is loaded")
        self._retired.add(self._adapters.pop(name))
        self._free_retired()

    def _free_retired(self) -> None:
        """Delete the retired keys no row uses, keeping one (not the merged one) as the spare
        while adapters are loaded; with none left, the spare goes too."""
        if not self._retired and (self._spare is None or self._adapters):
            return
        in_use = {r.adapter_key for r in self._live()}
        free = sorted(self._retired - in_use)
        self._retired.difference_update(free)
        for key in free:  # deleted, or kept as the spare: no request reaches them again
            if key in self._identity:
                self._prefix.retire(self._identity.pop(key))
        if not self._adapters and self._spare is not None:
            free.append(self._spare)  # nothing left to load into it
            self._spare = None
        elif self._adapters and self._spare is None:
            keep = [k for k in free if k != self._merged_key]
            if keep:
                self._spare = keep[-1]  # kept for the next load (_load_into_spare)
                free.remove(self._spare)
        self._delete_keys(free)

    def _delete_keys(self, keys: list[str]) -> None:
        if not keys or self.model is self.base_model:
            return
        if self._merged_key in keys:
            self._merged, self._merged_key = None, None
            if self._packs():
                pack_linears(self.base_model, missing_only=True)  # what the base gave up
        left = set(self.model.peft_config) - set(keys)
        if not left:
            # peft keeps pointing at a deleted active adapter: go back to the plain model.
            self.base_model = self.model.unload()
            self.model = self.base_model
            return
        if self.model.active_adapter in keys:
            self.model.set_adapter(
                sorted(left)[0]
            )  # rows pick adapters by name; this is peft's default
        for key in keys:
            with contextlib.suppress(Exception):
                self.model.delete_adapter(key)


def _merge_into(out: torch.Tensor, module: Any, key: str) -> None:
    """out = base weight + scale * B @ A, in one pass over the weight (an `addmm` into
    `out`, no temporary of the weight's size). DoRA and fan-in-fan-out layers take peft's
    own delta."""
    base = module.base_layer.weight
    if module.use_dora.get(key) or getattr(module, "fan_in_fan_out", False):
        out.copy_(base + module.get_delta_weight(key))
        return
    a, b = module.lora_A[key].weight, module.lora_B[key].weight  # (r, in), (out, r)
    torch.addmm(base, b.to(base.dtype), a.to(base.dtype), alpha=module.scaling[key], out=out)


def _merged_weight(base: torch.Tensor, module: Any, key: str) -> torch.Tensor:
    """A new tensor: `base` (the LoRA layer's base weight) + scale * B @ A."""
    out = torch.empty_like(base)
    _merge_into(out, module, key)
    return out


def _check_adapter_fits(model: Any, name: str, path: str) -> dict[str, torch.Tensor] | None:
    """Refuse, before touching the model, an adapter whose LoRA shapes do not fit it or
    whose weights are not all finite (it would serve one token over and over). Returns the
    LoRA tensors it read (None for a .bin adapter), so a load need not read them again."""
    from safetensors import safe_open

    files = list(Path(path).glob("adapter_model.safetensors"))
    if not files:
        return None  # a .bin adapter: peft checks it (we never unpickle it ourselves)
    modules = dict(model.named_modules())
    try:
        handle = safe_open(str(files[0]), framework="pt")
    except Exception as exc:  # safetensors raises its own error type for a bad header
        raise UsageError(
            f"adapter {name!r}: {files[0]} is not a readable safetensors file ({exc})"
        ) from exc
    tensors: dict[str, torch.Tensor] = {}
    with handle as f:
        for k in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            tensors[k] = f.get_tensor(k)
            if ".lora_A." not in k and ".lora_B." not in k:
                continue
            target = k.split(".lora_")[0].removeprefix("base_model.model.")
            module = modules.get(target)
            shape = tensors[k].shape
            if module is None or not hasattr(module, "in_features"):
                raise UsageError(
                    f"adapter {name!r} targets {target!r}, which this base model does not have"
                )
            want = module.in_features if ".lora_A." in k else module.out_features
            got = shape[1] if ".lora_A." in k else shape[0]
            if got != want:
                raise UsageError(
                    f"adapter {name!r} does not fit this base model: {target} has {want} "
                    f"features, the adapter has {got} (was it trained on another base model?)"
                )
            if not bool(torch.isfinite(tensors[k]).all()):
                raise UsageError(f"adapter {name!r}: {k} holds NaN or infinite weights")
    return tensors


@dataclass
class _Start:
    """The KV a row's prefill starts from: `tokens` steps from a prefix-cache `hit`, or
    from a `head` computed in this batch ((keys, values) per layer, (1, H, P, D))."""

    tokens: int
    hit: PrefixHit | None = None
    head: list[tuple[torch.Tensor, torch.Tensor]] | None = None


def _device_memory(device: torch.device) -> int:
    """Bytes of memory of `device` (the machine's RAM for the CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


_KV_GROWTH = 512
"""Most tokens a row is counted to grow by in the KV budget (its max_tokens, when smaller)."""


def _kv_token_bytes(config: Any, dtype: torch.dtype) -> int:
    """Bytes of KV cache one token takes: keys and values of every layer's KV heads."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.empty((), dtype=dtype).element_size()
    return int(config.num_hidden_layers) * 2 * int(heads) * int(head_dim) * element


def _kv_budget(budget: int | None, device: torch.device) -> int:
    """The running batch's KV budget in bytes (`TorchEngineConfig.max_kv_bytes`; 0: none)."""
    if budget is not None:
        return budget
    total = _device_memory(device)
    return total // 4 if device.type == "cuda" else min(total // 16, 512 << 20)


def _prefix_budget(budget: int | None, device: torch.device) -> int:
    """The prefix cache's budget in bytes (`TorchEngineConfig.prefix_cache_bytes`; the config
    refuses negative budgets, this the ones beyond the device)."""
    total = _device_memory(device)
    if budget is None:
        return min(total // 32, 1 << 30)
    if budget > total:
        raise UsageError(
            f"prefix_cache_bytes={budget} is more than the {device.type} device's memory "
            f"({total} bytes); pick a smaller budget, or None for the default"
        )
    return budget


def _full_attention_only(config: Any) -> bool:
    """Whether every layer of the model attends to the whole context (no sliding window)."""
    kinds = getattr(config, "layer_types", None)
    return not kinds or all(k == "full_attention" for k in kinds)


_MIN_SHARED_PREFIX = 16
"""Shorter common prefixes are prefilled per row (a separate forward would cost more)."""


def _shared_prefix(rows: list[_Request]) -> int:
    """Length of the prompt prefix all rows share, leaving each row at least one own token."""
    if len(rows) < 2:
        return 0
    ids = [r.prompt_ids for r in rows]
    lo, hi = min(ids), max(ids)  # lexicographic: their common prefix is everyone's
    n = min(len(lo), len(hi))
    common = next((i for i in range(n) if lo[i] != hi[i]), n)
    return max(min(common, min(len(x) for x in ids) - 1), 0)


def _pad_left_2d(x: torch.Tensor, width: int) -> torch.Tensor:
    """(B, T) -> (B, width), zeros on the left."""
    extra = width - x.shape[1]
    return x if extra == 0 else torch.nn.functional.pad(x, (extra, 0))


def _settle(fut: asyncio.Future[Any], item: Any) -> None:
    if fut.done():
        return
    if isinstance(item, BaseException):
        fut.set_exception(item)
    else:
        fut.set_result(item)


def _cache_keyword(model: Any) -> str:
    """The forward keyword that takes the KV cache: `cache` since transformers 5.24,
    `past_key_values` before (5.24 still takes it, with a deprecation warning per call)."""
    import inspect

    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Hand `fn(*args)` from the engine's thread to `loop`. A loop already closed (the
    process is stopping: Ctrl-C while a batch was decoding) has nobody left to tell."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise
