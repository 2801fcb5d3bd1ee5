"""The torch engine: transformers + peft, continuous batching, several LoRA adapters.

One worker thread owns the model. Requests from any event loop are queued; at every
step the worker admits new requests (a batched, left-padded prefill whose KV cache is
merged into the running batch), then runs one decode forward for every active
sequence, samples a token per row (each row with its own temperature, top-p, seed,
grammar and adapter), and retires the rows that finished. Tokens a row's grammar forces or
its context suggests go in the next forward (`fast_forward.py`, `speculative.py`). Rows of
one batch may use different LoRA adapters (peft's mixed-adapter batches).
`scheduling="dynamic"` admits new requests only when the batch has drained (see bench/).

Adapter loads and unloads run on the worker thread between two steps, so a swap never
races a forward pass, and an adapter that is replaced is freed only once no running
sequence uses it. The adapters themselves (their peft keys, the spare key a load writes
into in place, the merged copy of the latest one) live in `engine/adapter_slots.py`.

A prefix cache (`engine/prefix_cache.py`) keeps the KV of earlier requests across
requests, keyed by the weights they were computed under: an agent's next turn, or a
group member admitted later, prefills only its new tokens (`cached_tokens` in each
result, counters in `metrics()`).

Runs on CUDA when present, else on the CPU (the dtype: `devices.pick_engine_dtype`),
with weights prepacked for oneDNN there (`engine/packed_linear.py`).

This module is the worker: the queue, admission, prefill, decode and sampling. The rows
decoding together are `engine/batch.py`'s (their KV cache grows in place, `kv_cache.py`),
where each new row starts `engine/prefill.py`'s, each request's record, finish check and
result `engine/request.py`'s. Its settings are `TorchEngineConfig` (`engine/torch_config.py`,
re-exported here), and the default memory budgets `engine/budgets.py`'s.

Left out: paged attention and chunked prefill; vLLM is the engine for those.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from art_langgraph.engine.adapter_slots import BASE_KEY, AdapterSlots
from art_langgraph.engine.admission import Inbox
from art_langgraph.engine.base import (
    EngineMetrics,
    EngineTraits,
    GenerateResult,
    SamplingParams,
    TokenEvent,
)
from art_langgraph.engine.batch import RunningBatch
from art_langgraph.engine.batch_head import BatchHead, form_head, set_engine_attention
from art_langgraph.engine.budgets import kv_budget, kv_token_bytes, prefix_budget
from art_langgraph.engine.constrained import GrammarCompiler
from art_langgraph.engine.fast_forward import forced_width, read_ahead, record_fed, step_inputs
from art_langgraph.engine.kv_cache import cache_keyword, growing_cache
from art_langgraph.engine.packed_linear import pack_linears
from art_langgraph.engine.prefill import (
    PrefillStart,
    head_kv,
    padding_chunks,
    prefill_inputs,
    prefix_clusters,
    start_after,
)
from art_langgraph.engine.prefix_cache import PrefixCache, full_attention_only, waiting_pins
from art_langgraph.engine.request import Request, checked_prompt, to_future, to_queue
from art_langgraph.engine.sampling import raw_logprobs, sample_rows, top_pairs
from art_langgraph.engine.speculative import PromptLookup
from art_langgraph.engine.torch_config import TorchEngineConfig
from art_langgraph.errors import InfrastructureError, UsageError
from art_langgraph.runtime import devices
from art_langgraph.runtime.heap import use_mmap_for_large_blocks

log = logging.getLogger(__name__)


class TorchEngine:
    """An `InferenceEngine` on transformers + peft. Build it with `from_pretrained`."""

    def __init__(self, model: Any, tokenizer: Any, config: TorchEngineConfig | None = None) -> None:
        self.config = config or TorchEngineConfig()
        self.tokenizer = tokenizer
        self._cache_kw = cache_keyword(model)
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
        self._generator = torch.Generator(device="cpu").manual_seed(self.config.seed)
        self._closing = False
        self._batch = RunningBatch(self.device)  # the rows decoding (the worker thread's)
        self.steps = 0
        """Decode steps run so far (for tests and metrics)."""
        self.shared_prefix_tokens = 0
        """Prompt tokens not prefilled because a batch shared them (for tests and metrics)."""
        self.forced_tokens = 0
        """Completion tokens a grammar forced (`fast_forward`; for tests and metrics)."""
        self.lookup = PromptLookup(self.config, self.grammars, self.eos_token_ids)
        """Speculative tokens by prompt lookup, and their counts (`engine/speculative.py`)."""
        self.head_rows = 0
        """Rows admitted after a batch head, holding only what follows it (for tests)."""
        self._prefix = PrefixCache(
            prefix_budget(self.config.prefix_cache_bytes, self.device),
            self.config.prefix_cache_block_size,
        )
        want_head = self.config.batch_head and full_attention_only(model.config)
        self._head_on = set_engine_attention(model, want_head)
        if self._prefix.enabled and not full_attention_only(model.config):
            log.info("prefix cache off: the model has layers that are not full attention")
            self._prefix = PrefixCache(0, self.config.prefix_cache_block_size)
        self._inbox = Inbox(
            self.config,
            kv_budget(self.config.max_kv_bytes, self.device),
            kv_token_bytes(model.config, next(model.parameters()).dtype),
            heads=self._head_on,
            block_size=self._prefix.block_size,
        )
        """Queued requests and commands, and which of them join the batch at a step."""
        batch = self._batch  # not `self`: a closure over the engine would keep a closed
        # engine's weights and caches alive until the garbage collector's next full pass
        self._slots = AdapterSlots(
            model,
            shared_base=self.shared_base,
            prefix=self._prefix,
            in_use=lambda: {r.adapter_key for r in batch.live()},
            merge_latest=self.config.merge_latest,
            prepack_weights=self.config.prepack_weights,
        )
        """The model and its LoRA adapters (`engine/adapter_slots.py`; the worker thread's)."""
        self._inbox.pin, self._inbox.unpin = waiting_pins(self._prefix, self._slots.identity)
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
        device = devices.pick_device(config.device)
        params = devices.parameter_count(path) if config.dtype is None else None
        dtype_name = devices.pick_engine_dtype(config.dtype, device, params)
        hf_logging.disable_progress_bar()
        tokenizer = AutoTokenizer.from_pretrained(path)
        if config.chat_template is not None:
            from art_langgraph.chat.templates import load_chat_template

            tokenizer.chat_template = load_chat_template(config.chat_template)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=devices.torch_dtype(dtype_name))
        model = model.to(device).eval()  # type: ignore[arg-type]
        engine = cls(model, tokenizer, config)
        engine.model_path = path
        return engine

    model_path: str = ""
    """The folder or id the weights came from."""

    @property
    def model(self) -> Any:
        """The model batches run: `base_model`, or a peft `PeftModel` over it once an
        adapter is loaded (back to the plain model when the last one is unloaded)."""
        return self._slots.model

    @property
    def base_model(self) -> Any:
        """The plain model the engine loaded (peft's base model while adapters are loaded)."""
        return self._slots.base_model

    # ---------------------------------------------------------------- public
    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None = None
    ) -> GenerateResult:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[GenerateResult] = loop.create_future()
        req = self._submit(prompt_ids, sampling, adapter, to_future(loop, fut), stream=False)
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
        req = self._submit(prompt_ids, sampling, adapter, to_queue(loop, q), stream=True)
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
        await self._command(lambda: self._slots.load(name, path))

    async def unload_adapter(self, name: str) -> None:
        await self._command(lambda: self._slots.unload(name))

    def list_adapters(self) -> list[str]:
        return sorted(self._slots.adapters)

    def metrics(self) -> EngineMetrics:
        return dataclasses.replace(
            self._counts,
            prefix_cache_evictions=self._prefix.evictions,
            prefix_cache_bytes=self._prefix.bytes,
            prefix_cache_capacity_bytes=self._prefix.budget_bytes,
            running=self.active,
            waiting=self._inbox.waiting(),
        )

    @property
    def traits(self) -> EngineTraits:
        """Its weights' dtype, and the frozen base a trainer in this process wraps (one copy
        of the weights); any LoRA rank loads."""
        dtype = str(self.shared_base.dtype).removeprefix("torch.")
        return EngineTraits(weights_dtype=dtype, shared_base=self.shared_base)

    async def reset_prefix_cache(self) -> None:
        """Empty the prefix cache now (a training step is about to replace the weights its
        KV was computed under, and nothing is served meanwhile): its memory goes to the
        trainer instead of waiting for the swap."""
        await self._command(self._prefix.clear)

    @property
    def prefix_cache(self) -> PrefixCache:
        """The prefix cache (for tests and benchmarks; the worker thread owns it)."""
        return self._prefix

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        self._closing = True
        self._inbox.put(None)
        self._thread.join(30)

    @property
    def active(self) -> int:
        """Sequences being decoded now."""
        return self._batch.active

    @property
    def admitted_in_place(self) -> int:
        """Rows admitted into free slots of a running batch (no copy of the others)."""
        return self._batch.admitted_in_place

    # ------------------------------------------------------------- internals
    def _submit(self, prompt_ids, sampling, adapter, emit, *, stream) -> Request:
        if self._closing:
            raise InfrastructureError("the engine is closed")
        prompt = checked_prompt(prompt_ids, self.vocab_size, self.context_length)
        key = BASE_KEY
        if adapter is not None:
            if adapter not in self._slots.adapters:
                raise UsageError(
                    f"no adapter named {adapter!r} is loaded; loaded: {self.list_adapters()}"
                )
            key = self._slots.adapters[adapter]
        req = Request(prompt, sampling, adapter, key, emit, stream)
        if sampling.grammar is not None:
            req.matcher = self.grammars.matcher(sampling.grammar)
        self._inbox.put(req)
        return req

    async def _command(self, fn: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._inbox.put(("cmd", fn, to_future(loop, fut)))  # done(None) or done(error)
        await fut

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        try:
            self.grammars.warm_up()
        except Exception:  # constrained requests will report their own errors
            log.exception("grammar warm-up failed")
        while not self._closing:
            new: list[Request] = []
            try:
                new = self._inbox.take(
                    self._batch, block=not self.active, closing=lambda: self._closing
                )
                if new:
                    self._prefill(new)
                    for r in new:
                        self._inbox.unpin(r)
                if self._batch.rows:
                    self._decode()
                self._slots.free_retired()
            except Exception as exc:  # a bug or an OOM: fail the batch, keep serving
                log.exception("engine step failed")
                failed = {id(r): r for r in [*self._batch.live(), *new]}
                for r in failed.values():
                    self._inbox.unpin(r)
                    r.emit(InfrastructureError(f"engine step failed: {exc!r}"))
                self._batch.reset()
        for r in self._batch.live():
            r.emit(r.result("abort"))
        self._inbox.abort_all()

    def _forward(
        self, input_ids, mask, pos, cache, keys: list[str], keep: int = 1, head: Any = None
    ) -> torch.Tensor:
        """The logits of each row's last token (B, V), or of its last `keep` (B, keep, V);
        `head`: the `BatchHead` the rows' cache follows (None: the cache holds it all)."""
        model, scope, kwargs = self._slots.route(keys)
        if head is not None:
            kwargs = {**kwargs, "batch_head": head}
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
                logits_to_keep=keep,
                **kwargs,
            )
        return out.logits[:, -1, :] if keep == 1 else out.logits

    def _prefill(self, new: list[Request]) -> None:
        """Prefill the new rows. Each row starts from the longest prefix of its prompt that
        the prefix cache holds under its weights. Where rows of one adapter share a longer
        prompt prefix (a group's system prompt and first turn), that head runs once and
        every such row starts from it. The rest of each prompt runs left-padded after its
        start ([pads | start | pads | suffix], pads masked out, positions continuing), rows
        of unlike lengths in forwards apart (`padding_chunks`). All of it after the batch's
        head, when it has one (`engine/batch_head.py`): rows joining a batch hold only what
        follows it (a row that does not open with it dissolves it first; rows that share a
        head with a batch that has none condense it out of the batch's rows), and rows
        forming a batch form its head from their common prefix."""
        pc, batch = self._prefix, self._batch
        for r in new:
            # A key retired while the request queued has no identity: share nothing.
            r.identity = self._slots.identity(r.adapter_key)
        if batch.head is not None and not all(
            batch.head.covers(r.prompt_ids, r.identity) for r in new
        ):
            batch.dissolve_head()
        elif batch.active and batch.head is None and self._head_on and len(new) > 1:
            batch.condense_head(new, pc.block_size)
        head = batch.head
        if not batch.active and self._head_on:
            head = form_head(new, pc, lambda ids, st, r: self._prefill_rows([ids], [st], [r], None))
        skip = head.length if head is not None else 0
        starts: list[PrefillStart] = []
        for r in new:
            hit = pc.lookup(r.identity, r.prompt_ids, len(r.prompt_ids) - 1)
            r.cached = hit.tokens
            starts.append(start_after(hit, skip, pc.block_size))
            self._counts.prompt_tokens += len(r.prompt_ids)
            self._counts.prefix_cache_queries += len(r.prompt_ids)
            self._counts.prefix_cache_hits += hit.tokens
        prompts = [r.prompt_ids[skip:] for r in new]
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(new):
            groups.setdefault(r.adapter_key, []).append(i)
        clusters = [
            ([idx[k] for k in members], shared)
            for idx in groups.values()
            for members, shared in prefix_clusters(
                [prompts[i] for i in idx], [starts[i].tokens for i in idx]
            )
        ]
        if clusters:
            # Each cluster's shared head runs once, heads of like lengths in one forward;
            # every row of a cluster then starts from its head's KV.
            firsts = [new[m[0]] for m, _ in clusters]
            ids = [r.prompt_ids[: skip + n] for r, (_, n) in zip(firsts, clusters, strict=True)]
            hits = [pc.lookup(r.identity, p, len(p) - 1) for r, p in zip(firsts, ids, strict=True)]
            heads = [start_after(h, skip, pc.block_size) for h in hits]
            run = functools.partial(self._prefill_rows, head=head)
            kvs = head_kv([p[skip:] for p in ids], heads, firsts, run)
            for (members, shared), kv in zip(clusters, kvs, strict=True):
                for i in members:
                    starts[i] = PrefillStart(shared, head=kv)
                self.shared_prefix_tokens += shared * (len(members) - 1)
        for chunk in padding_chunks(
            [len(p) - st.tokens for p, st in zip(prompts, starts, strict=True)]
        ):
            rows = [new[i] for i in chunk]
            cache, mask, pos, logits = self._prefill_rows(
                [prompts[i] for i in chunk], [starts[i] for i in chunk], rows, head
            )
            now = time.perf_counter()
            for r in rows:
                r.t_first = now
            batch.merge(
                rows, cache, mask, self._sample(rows, logits).to(self.device), pos[:, -1] + 1
            )
            del cache
        batch.head = head
        self.head_rows += len(new) if head is not None else 0
        self._retire_finished()

    def _prefill_rows(
        self,
        prompts: list[list[int]],
        starts: list[PrefillStart],
        rows: list[Request],
        head: BatchHead | None,
    ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One prefill forward of `prompts` (what follows `head`, when given), each row
        after its start's KV; every full block of each prompt goes into the prefix cache.
        Returns the cache, the (B, T) mask, the (B, S) positions of the suffix and the
        (B, V) logits of each row's last token."""
        cache = growing_cache(self.model.config)
        ids, mask, pos = prefill_inputs(
            cache, prompts, starts, self.pad_token_id, self._prefix.block_size, self.device
        )
        skip = head.length if head is not None else 0
        pos = pos + skip
        logits = self._forward(ids, mask, pos, cache, [r.adapter_key for r in rows], head=head)
        if self._prefix.enabled:
            lead = list(head.ids) if head is not None else []
            for i, (p, r) in enumerate(zip(prompts, rows, strict=True)):
                self._prefix.insert_row(r.identity, lead + p, cache, i, mask[i], skip)
        return cache, mask, pos, logits

    def _decode(self) -> None:
        runs = [len(r.forced or r.draft) if r is not None else 0 for r in self._batch.rows]
        if any(runs):
            self._decode_forced(runs)
            return
        batch = self._batch
        assert batch.mask is not None and batch.next is not None and batch.pos is not None
        b = len(batch.rows)
        batch.mask = torch.cat(
            [batch.mask, torch.ones((b, 1), dtype=torch.long, device=self.device)], 1
        )
        live = [i for i, r in enumerate(batch.rows) if r is not None]
        rows = [r for r in batch.rows if r is not None]
        # A free slot runs along with the key of a live row (one adapter stays one batch);
        # its output is dropped.
        fill = rows[0].adapter_key
        logits = self._forward(
            batch.next.unsqueeze(1),
            batch.mask,
            batch.pos.unsqueeze(1),
            batch.cache,
            [r.adapter_key if r is not None else fill for r in batch.rows],
            head=batch.head,
        )
        if len(live) < b:
            idx = torch.tensor(live, device=self.device)
            batch.next = batch.next.clone()
            batch.next[idx] = self._sample(rows, logits[idx]).to(self.device)
        else:
            batch.next = self._sample(rows, logits).to(self.device)
        batch.pos = batch.pos + 1
        self.steps += 1
        self._retire_finished()

    def _decode_forced(self, runs: list[int]) -> None:
        """One decode forward in which rows feed, after their next token, up to
        `forced_width` tokens of their grammar's forced run, each recorded from this
        forward's logits; rows whose run is used up sample as any decode does
        (`engine/fast_forward.py`)."""
        batch = self._batch
        assert batch.mask is not None and batch.next is not None and batch.pos is not None
        width = forced_width(runs, self.lookup.worth(batch.rows))
        fed = [min(n, width) for n in runs]
        nxt = batch.next.tolist()
        ids, new_mask, offsets = step_inputs(batch.rows, nxt, fed, self.pad_token_id)
        dev, q = self.device, ids.shape[1]
        batch.mask = torch.cat([batch.mask, new_mask.to(dev)], 1)
        fill = next(r for r in batch.rows if r is not None).adapter_key
        logits = self._forward(
            ids.to(dev),
            batch.mask,
            batch.pos.unsqueeze(1) + offsets.to(dev),
            batch.cache,
            [r.adapter_key if r is not None else fill for r in batch.rows],
            keep=q,
            head=batch.head,
        )
        logits = logits.unsqueeze(1) if q == 1 else logits  # (B, q, V)
        self.steps += 1
        to_sample, recorded = record_fed(batch.rows, logits, fed, nxt)
        self.forced_tokens += recorded
        moved, kept = self.lookup.verify(batch, logits, fed, nxt, self._generator)
        self._counts.generation_tokens += recorded + kept
        if to_sample:
            rows = [r for i in to_sample if (r := batch.rows[i]) is not None]
            tokens = self._sample(rows, logits[torch.tensor(to_sample), -1])
            for i, t in zip(to_sample, tokens.tolist(), strict=True):
                nxt[i] = t
        batch.next = torch.tensor(nxt, dtype=torch.long, device=dev)
        batch.pos = batch.pos + torch.tensor(moved, device=dev)
        self._retire_finished()
        if batch.rows:
            batch.squeeze_pads()

    def _sample(self, rows: list[Request], logits: torch.Tensor) -> torch.Tensor:
        """Pick one token per row, record it and its logprob; returns (B,) ids on the CPU."""
        logits = logits.float()
        lp = raw_logprobs(logits)  # (B, V), before grammar masks
        constrained = [
            (i, r.matcher, r.ready_mask) for i, r in enumerate(rows) if r.matcher is not None
        ]
        no_eos = [i for i, r in enumerate(rows) if r.sampling.ignore_eos]
        if no_eos:
            logits[torch.tensor(no_eos).unsqueeze(1), self._eos_index] = float("-inf")
        if constrained:
            bitmask = self.grammars.allocate_bitmask(len(constrained))
            self.grammars.mask_logits(logits, constrained, bitmask)
        temp = torch.tensor([r.sampling.temperature for r in rows], device=logits.device)
        top_p = torch.tensor([r.sampling.top_p for r in rows], device=logits.device)
        tokens = sample_rows(
            logits, temp, top_p, [r.seeded_uniform() for r in rows], self._generator
        )
        chosen = lp.gather(1, tokens.unsqueeze(1)).squeeze(1)  # (B,)
        tokens = tokens.cpu()
        tok_list, lp_list = tokens.tolist(), chosen.tolist()
        self._counts.generation_tokens += len(tok_list)
        tops = top_pairs(lp, [r.sampling.top_logprobs for r in rows])
        for i, r in enumerate(rows):
            r.record(tok_list[i], lp_list[i], tops[i])
        return tokens

    def _retire_finished(self) -> None:
        """Emit the rows that finished and free their slots. A freed slot keeps its place
        (its mask row zeroed) for the next admitted row, so retiring copies nothing; the
        batch is compacted only once free slots outnumber live rows (`RunningBatch.shrink`)."""
        batch = self._batch
        assert batch.mask is not None
        retired = False
        for i, r in enumerate(batch.rows):
            if r is None:
                continue
            done = r.finish_reason(self.eos_token_ids, self.tokenizer, self.context_length)
            if done is None:
                if r.matcher is not None and not r.forced and self.config.fast_forward:
                    r.forced = read_ahead(r, self.grammars, self.eos_token_ids, self.context_length)
                if not r.forced and not r.draft:
                    self.lookup.draft(r, self.context_length)
                continue
            if self._prefix.enabled and len(r.completion) > 1:
                seen = r.prompt_ids + r.completion  # the last one fed or not: insert_row
                skip = batch.head.length if batch.head is not None else 0
                self._prefix.insert_row(r.identity, seen, batch.cache, i, batch.mask[i], skip)
            r.emit(r.result(done[0], done[1]))
            batch.free(i)
            retired = True
        if retired:
            batch.shrink()
