"""The torch engine on the tiny model: batching is exact, logprobs are right, adapters route."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from art_langgraph.engine import GenerateResult, SamplingParams, TokenEvent, TorchEngine
from art_langgraph.engine.prefill import padding_chunks, prefix_clusters
from art_langgraph.errors import ContextLengthError, UsageError
from art_langgraph.presets import TinySpec, build_tiny


def _prompt(engine: TorchEngine, text: str) -> list[int]:
    rendered = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return engine.tokenizer.encode(rendered, add_special_tokens=False)


def _base(engine: TorchEngine):  # type: ignore[no-untyped-def]
    """The model with every adapter off (a plain model before the first adapter)."""
    if engine.model is engine.base_model:
        return contextlib.nullcontext(engine.model)
    return _disabled(engine)


@contextlib.contextmanager
def _disabled(engine: TorchEngine):  # type: ignore[no-untyped-def]
    with engine.model.disable_adapter():
        yield engine.model


def _greedy_reference(engine: TorchEngine, ids: list[int], n: int) -> list[int]:
    with _base(engine) as model, torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
        )
    return out[0, len(ids) :].tolist()


async def test_concurrent_greedy_equals_generate_row_by_row(engine: TorchEngine) -> None:
    prompts = [_prompt(engine, "word " * k) for k in (1, 5, 17, 40)]
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)

    # stagger arrivals so later requests join a running batch (continuous batching)
    async def late(i: int, p: list[int]) -> GenerateResult:
        await asyncio.sleep(0.01 * i)
        return await engine.generate(p, greedy)

    results = await asyncio.gather(*(late(i, p) for i, p in enumerate(prompts)))
    for p, r in zip(prompts, results, strict=True):
        assert r.completion_token_ids == _greedy_reference(engine, p, 12)
        assert r.finish_reason == "length" and len(r.logprobs) == 12


async def test_rows_admitted_into_freed_slots_are_exact(engine: TorchEngine) -> None:
    """Short requests finish and free their slots while long ones run; later requests
    take those slots in place. Every row still equals its own greedy generation.

    The later requests are sent when the short ones have returned, not after a delay: on a
    fast machine a fixed delay let the long rows finish first (CI saw no slot admitted)."""
    long = [_prompt(engine, "word " * k) for k in (30, 34, 38)]
    short = [_prompt(engine, f"hi {k}") for k in (1, 2)]
    later = [_prompt(engine, f"x {k}") for k in (3, 4)]
    before = engine.admitted_in_place

    async def run(p: list[int], n: int) -> GenerateResult:
        return await engine.generate(
            p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        )

    long_tasks = [asyncio.create_task(run(p, 120)) for p in long]
    short_results = await asyncio.gather(*(run(p, 2) for p in short))
    assert not any(t.done() for t in long_tasks)  # the long rows still run beside free slots
    later_results = await asyncio.gather(*(run(p, 6) for p in later))
    long_results = await asyncio.gather(*long_tasks)
    for prompts, n, results in (
        (long, 120, long_results),
        (short, 2, short_results),
        (later, 6, later_results),
    ):
        for p, r in zip(prompts, results, strict=True):
            assert r.completion_token_ids == _greedy_reference(engine, p, n)
    assert engine.admitted_in_place - before >= 1  # the slot path ran


async def test_a_shared_prompt_prefix_is_prefilled_once_and_changes_nothing(
    engine: TorchEngine,
) -> None:
    """An agent's rollouts share a long system prompt: it runs once for the whole batch, and
    every row's greedy tokens equal `generate`'s and its logprobs a teacher-forced forward's."""
    system = "You are a careful agent with tools for weather, sums and search. " * 4
    prompts = [
        engine.tokenizer.encode(
            str(
                engine.tokenizer.apply_chat_template(
                    [{"role": "system", "content": system}, {"role": "user", "content": q}],
                    add_generation_prompt=True,
                    tokenize=False,
                )
            ),
            add_special_tokens=False,
        )
        for q in ("sum 1 2", "weather in Oslo today please", "x", "search the files for the word")
    ]
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    before = engine.shared_prefix_tokens
    results = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
    shared = next(i for i in range(len(prompts[2])) if len({p[i] for p in prompts}) > 1)
    assert shared > 40
    # all four normally share one prefill (3 x shared); a loaded machine may admit the first
    # request alone before the others arrive, so at least two of them must have shared it
    assert engine.shared_prefix_tokens - before >= shared
    for p, r in zip(prompts, results, strict=True):
        assert r.completion_token_ids == _greedy_reference(engine, p, 10)
        full = torch.tensor([p + r.completion_token_ids])
        with _base(engine) as model, torch.inference_mode():
            logits = model(full).logits[0, len(p) - 1 : -1].float()  # (T, V)
        want = torch.log_softmax(logits, -1)[torch.arange(10), r.completion_token_ids]
        assert torch.allclose(torch.tensor(r.logprobs), want, atol=1e-4)


def test_prefix_clusters_pick_the_heads_that_save_the_most() -> None:
    """A GRPO batch: each prompt several times. Rows of one prompt share it whole (less a
    token of their own); prompts that share only a short header are not joined."""
    a = list(range(100))
    a2 = a[:30] + [999] * 70  # shares 30 tokens with `a`
    b = [7, 8, *range(200, 260)]
    runs = prefix_clusters([a, b, a, a2, a, b, a2, [5]], [0] * 8)
    assert sorted((sorted(m), s) for m, s in runs) == [([0, 2, 4], 99), ([1, 5], 61), ([3, 6], 99)]
    # a system prompt and tools shared by every row, then each its own question: one head
    system = list(range(40))
    asks = [[*system, 500 + i, 600 + i] for i in range(4)]
    assert prefix_clusters(asks, [0] * 4) == [([0, 1, 2, 3], 40)]
    # what the prefix cache already holds is not worth a head
    assert prefix_clusters([a, a], [90, 0]) == []
    assert prefix_clusters([a, a], [50, 0]) == [([0, 1], 99)]


async def test_groups_of_different_prompts_each_prefill_their_prompt_once(
    engine: TorchEngine,
) -> None:
    """Two groups of a GRPO step, each of one prompt with its own tools: each prompt's KV is
    computed once for its group, and every row's greedy tokens equal `generate`'s alone."""
    prompts = [
        _prompt(engine, "You have tools for weather, sums and search. " * 3 + "sum 1 2"),
        _prompt(engine, "Your one tool reads files from the disk of this host. " * 3 + "read"),
    ]
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    before = engine.shared_prefix_tokens
    batch = [p for p in prompts for _ in range(3)]
    results = await asyncio.gather(*(engine.generate(p, greedy) for p in batch))
    # normally 2 x (len - 1) per group; a loaded machine may admit a row alone first
    assert engine.shared_prefix_tokens - before >= len(prompts[1]) - 1
    for p, r in zip(batch, results, strict=True):
        assert r.completion_token_ids == _greedy_reference(engine, p, 8)


def test_padding_chunks_keep_short_rows_apart_from_long_ones() -> None:
    """One forward pads every row to the longest: one-token rows after a shared head go
    apart from whole prompts; near lengths stay together; every row is in one chunk."""
    chunks = padding_chunks([1, 1, 1, 800, 500, 1, 1])
    assert sorted(i for c in chunks for i in c) == list(range(7))
    assert [0, 1, 2, 5, 6] in chunks and [3] in chunks and [4] in chunks
    assert padding_chunks([400, 410, 420, 430]) == [[0, 1, 2, 3]]  # padding < a forward's cost
    assert padding_chunks([7]) == [[0]] and padding_chunks([]) == []


async def test_rows_of_unlike_lengths_prefill_apart_and_exactly(engine: TorchEngine) -> None:
    """A group's rows (one token each after their shared head) and a long prompt of its own,
    admitted together, prefill in forwards apart, and every row equals `generate`'s."""
    group = _prompt(engine, "You have tools for weather, sums and search. " * 3 + "sum 1 2")
    alone = _prompt(engine, "Your one tool reads files from the disk of this host. " * 4)
    widths: list[list[int]] = []
    prefill_rows = engine._prefill_rows

    def recorded(prompts: list[list[int]], starts: Any, rows: Any, head: Any) -> Any:
        widths.append([len(p) - s.tokens for p, s in zip(prompts, starts, strict=True)])
        return prefill_rows(prompts, starts, rows, head)

    engine._prefill_rows = recorded  # type: ignore[method-assign]
    try:
        greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        batch = [group] * 3 + [alone]
        results = await asyncio.gather(*(engine.generate(p, greedy) for p in batch))
    finally:
        del engine._prefill_rows
    for p, r in zip(batch, results, strict=True):
        assert r.completion_token_ids == _greedy_reference(engine, p, 6)
    long = len(alone) // 2
    assert not [w for w in widths if min(w) == 1 and max(w) > long]  # no 1-token row padded


async def test_logprobs_match_a_teacher_forced_forward(engine: TorchEngine) -> None:
    prompt = _prompt(engine, "tell me something")
    r = await engine.generate(
        prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=3, ignore_eos=True)
    )
    full = torch.tensor([prompt + r.completion_token_ids])
    with _base(engine) as model, torch.inference_mode():
        logits = model(full).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(r.completion_token_ids)[:, None])[
        :, 0
    ]
    assert torch.allclose(torch.tensor(r.logprobs), want, atol=1e-4)


async def test_seed_reproduces_and_differs(engine: TorchEngine) -> None:
    p = _prompt(engine, "seeded")
    runs = await asyncio.gather(
        *(engine.generate(p, SamplingParams(max_tokens=20, seed=s)) for s in (11, 11, 12))
    )
    assert runs[0].completion_token_ids == runs[1].completion_token_ids
    assert runs[0].completion_token_ids != runs[2].completion_token_ids


async def test_stops(engine: TorchEngine) -> None:
    p = _prompt(engine, "stop test")
    first = await engine.generate(p, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    tok = first.completion_token_ids[2]
    by_id = await engine.generate(
        p, SamplingParams(max_tokens=8, temperature=0, stop_token_ids=(tok,))
    )
    assert by_id.finish_reason == "stop" and by_id.stop_reason == tok
    assert (
        by_id.completion_token_ids
        == first.completion_token_ids[: first.completion_token_ids.index(tok) + 1]
    )
    text = engine.tokenizer.decode(first.completion_token_ids, skip_special_tokens=True)
    needle = text[len(text) // 2 : len(text) // 2 + 2]
    by_str = await engine.generate(
        p, SamplingParams(max_tokens=8, temperature=0, stop=(needle,), ignore_eos=True)
    )
    assert by_str.finish_reason == "stop" and by_str.stop_reason == needle
    assert needle in engine.tokenizer.decode(by_str.completion_token_ids, skip_special_tokens=True)


async def test_stream_yields_each_token_then_the_result(engine: TorchEngine) -> None:
    p = _prompt(engine, "stream")
    items = [
        x async for x in engine.stream(p, SamplingParams(max_tokens=6, seed=1, ignore_eos=True))
    ]
    assert [type(x) for x in items] == [TokenEvent] * 6 + [GenerateResult]
    result = items[-1]
    assert isinstance(result, GenerateResult)
    assert [
        x.token_id for x in items[:-1] if isinstance(x, TokenEvent)
    ] == result.completion_token_ids


async def test_json_schema_grammar(engine: TorchEngine) -> None:
    schema = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    g = engine.grammars.json_schema(schema)
    rs = await asyncio.gather(
        *(
            engine.generate(
                _prompt(engine, "json"), SamplingParams(max_tokens=40, seed=s, grammar=g)
            )
            for s in range(4)
        )
    )
    for r in rs:
        obj = json.loads(engine.tokenizer.decode(r.completion_token_ids, skip_special_tokens=True))
        assert set(obj) == {"ok", "n"} and isinstance(obj["ok"], bool) and 0 <= obj["n"] <= 99
        assert r.finish_reason == "stop"


async def test_bad_requests(engine: TorchEngine) -> None:
    with pytest.raises(ContextLengthError, match=str(engine.context_length)):
        await engine.generate([5] * engine.context_length, SamplingParams(max_tokens=1))
    with pytest.raises(UsageError, match="empty"):
        await engine.generate([], SamplingParams())
    with pytest.raises(UsageError, match="token ids"):
        await engine.generate([10**6], SamplingParams())
    with pytest.raises(UsageError, match="no adapter"):
        await engine.generate([5, 6], SamplingParams(), adapter="nope")
    with pytest.raises(UsageError):
        SamplingParams(temperature=-1)


async def test_cancelled_request_does_not_disturb_the_others(engine: TorchEngine) -> None:
    p = _prompt(engine, "cancel")
    doomed = asyncio.create_task(
        engine.generate(p, SamplingParams(max_tokens=2000, ignore_eos=True))
    )
    kept = asyncio.create_task(
        engine.generate(p, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    )
    await asyncio.sleep(0.05)
    doomed.cancel()
    r = await kept
    for _ in range(200):
        if engine.active == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.active == 0
    # the reference runs only once the engine is idle: it toggles the same peft model
    assert r.completion_token_ids == _greedy_reference(engine, p, 10)


async def test_adapters_route_per_row_in_one_batch(engine: TorchEngine, lora_adapter: Path) -> None:
    await engine.load_adapter("lora-a", str(lora_adapter))
    assert "lora-a" in engine.list_adapters()
    p = _prompt(engine, "adapter test")
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    alone_base = await engine.generate(p, greedy)
    alone_lora = await engine.generate(p, greedy, adapter="lora-a")
    assert alone_base.completion_token_ids != alone_lora.completion_token_ids
    assert alone_base.completion_token_ids == _greedy_reference(engine, p, 10)
    with torch.inference_mode():
        engine.model.set_adapter(engine._slots.adapters["lora-a"])
        ref = engine.model.generate(
            input_ids=torch.tensor([p]), max_new_tokens=10, min_new_tokens=10, do_sample=False
        )
    assert alone_lora.completion_token_ids == ref[0, len(p) :].tolist()
    mixed = await asyncio.gather(
        *(engine.generate(p, greedy, adapter=a) for a in (None, "lora-a", None, "lora-a"))
    )
    assert [m.completion_token_ids for m in mixed] == [
        alone_base.completion_token_ids,
        alone_lora.completion_token_ids,
    ] * 2
    assert mixed[1].adapter == "lora-a"
    # replacing an adapter under the same name swaps what serves it
    await engine.load_adapter("lora-a", str(lora_adapter))
    again = await engine.generate(p, greedy, adapter="lora-a")
    assert again.completion_token_ids == alone_lora.completion_token_ids
    await engine.unload_adapter("lora-a")
    with pytest.raises(UsageError, match="no adapter"):
        await engine.generate(p, greedy, adapter="lora-a")


async def test_a_freed_adapter_slot_takes_the_next_adapter_exactly(
    engine: TorchEngine, lora_adapter: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    # A second adapter: the same settings, other weights; a third with another rank.
    other = tmp_path / "other"
    shutil.copytree(lora_adapter, other)
    file = other / "adapter_model.safetensors"
    save_file({k: -0.5 * v for k, v in load_file(str(file)).items()}, str(file))
    p = _prompt(engine, "slot test")
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)

    async def outputs(*names: str) -> list[list[int]]:
        alone = [(await engine.generate(p, greedy, adapter=n)).completion_token_ids for n in names]
        mixed = await asyncio.gather(*(engine.generate(p, greedy, adapter=n) for n in names))
        assert [m.completion_token_ids for m in mixed] == alone  # peft's per-row path agrees
        return alone

    await engine.load_adapter("a", str(lora_adapter))
    await engine.load_adapter("b", str(other))
    want_a, want_b = await outputs("a", "b")
    assert want_a != want_b
    key_a = engine._slots.adapters["a"]
    await engine.unload_adapter("a")
    assert engine._slots.spare == key_a  # kept, not deleted
    await engine.load_adapter("c", str(lora_adapter))  # written into the spare, in place
    assert engine._slots.adapters["c"] == key_a and engine._slots.spare is None
    assert await outputs("c", "b") == [want_a, want_b]
    await engine.unload_adapter("b")
    await engine.load_adapter("d", str(other))  # into b's freed slot
    assert await outputs("c", "d") == [want_a, want_b]
    # Another rank does not fit the spare: a regular load, still exact.
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(engine.base_model.name_or_path)
    await engine.unload_adapter("c")
    spare = engine._slots.spare
    m = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    m.save_pretrained(tmp_path / "r4")
    await engine.load_adapter("e", str(tmp_path / "r4"))
    assert engine._slots.adapters["e"] != spare and engine._slots.spare == spare
    assert await outputs("d") == [want_b]
    for name in ("d", "e"):
        await engine.unload_adapter(name)
    assert engine._slots.spare is None and engine.list_adapters() == []


async def test_the_merged_copy_holds_the_only_packed_copy_of_its_targets(
    engine: TorchEngine, lora_adapter: Path
) -> None:
    from art_langgraph.engine.packed_linear import PackedLinear, can_pack

    if not can_pack(engine.device, engine.shared_base.dtype):
        pytest.skip("no oneDNN packing for this engine")

    def packed(model: Any) -> set[str]:
        return {
            n.removesuffix(".base_layer")
            for n, m in model.named_modules()
            if isinstance(m, PackedLinear) and m._packed is not None
        }

    before = packed(engine.base_model)
    p = _prompt(engine, "packed copies")
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    await engine.load_adapter("a", str(lora_adapter))
    targets = {n for n in before if n.rsplit(".", 1)[-1] in ("q_proj", "v_proj", "up_proj")}
    assert targets and packed(engine.base_model) == before - targets  # given up to the merged copy
    assert packed(engine._slots.merged) == before  # its targets merged, the rest shared
    merged = await engine.generate(p, greedy, adapter="a")
    base = await engine.generate(p, greedy)  # the given-up layers run unpacked: still exact
    assert base.completion_token_ids == _greedy_reference(engine, p, 8)
    assert merged.completion_token_ids != base.completion_token_ids
    await engine.unload_adapter("a")
    assert engine._slots.merged is None and packed(engine.base_model) == before


async def test_adapter_errors(engine: TorchEngine, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a peft adapter"):
        await engine.load_adapter("x", str(tmp_path))
    with pytest.raises(UsageError, match="no adapter named"):
        await engine.unload_adapter("never-loaded")
    # an adapter trained on another base model (other shapes) is refused with a clear error
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    other = build_tiny(
        tmp_path / "cache", TinySpec(hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    )
    m = get_peft_model(
        AutoModelForCausalLM.from_pretrained(other), LoraConfig(r=4, target_modules=["q_proj"])
    )
    m.save_pretrained(tmp_path / "other")
    with pytest.raises(UsageError, match="does not fit this base model"):
        await engine.load_adapter("other", str(tmp_path / "other"))
    assert "other" not in engine.list_adapters()
    r = await engine.generate([5, 6, 7], SamplingParams(max_tokens=3))
    assert len(r.completion_token_ids) >= 1


async def test_a_caller_whose_loop_closed_mid_decode_costs_the_batch_nothing(
    engine: TorchEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """A process stopping (Ctrl-C) closes its event loop while rows still decode: their
    results have nowhere to go, and the other rows of the batch must not fail for it."""
    import threading

    long = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    started = threading.Event()

    def gone_caller() -> None:
        loop = asyncio.new_event_loop()
        pending = loop.create_task(engine.generate(_prompt(engine, "gone"), long))
        loop.run_until_complete(asyncio.sleep(0.05))  # submitted; now decoding
        assert not pending.done()
        started.set()
        loop.close()  # the task never finishes: its result arrives to a closed loop

    t = threading.Thread(target=gone_caller)
    t.start()
    await asyncio.to_thread(started.wait)
    out = await asyncio.wait_for(engine.generate(_prompt(engine, "still here"), long), 120)
    t.join()
    assert out.finish_reason == "length" and len(out.completion_token_ids) == 48
    await engine.generate(_prompt(engine, "after"), SamplingParams(max_tokens=4, temperature=0))
    assert "engine step failed" not in caplog.text


async def test_the_kv_budget_holds_rows_back_and_changes_no_output(tiny_path: Path) -> None:
    """`max_kv_bytes` for two rows at their widest: five requests run two at a time (the
    others wait in the queue), and each still equals its own greedy generation."""
    from art_langgraph.engine import TorchEngineConfig

    probe = TorchEngine.from_pretrained(str(tiny_path), TorchEngineConfig(dtype="float32"))
    per_token = probe._inbox.kv_token_bytes
    probe.close_sync()
    prompts = [_prompt(probe, f"word {k} " * 3) for k in range(5)]
    width = max(len(p) for p in prompts) + 16
    eng = TorchEngine.from_pretrained(
        str(tiny_path),
        TorchEngineConfig(dtype="float32", max_kv_bytes=2 * width * per_token + per_token),
    )
    try:
        greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, eng.active)
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(*(eng.generate(p, greedy) for p in prompts))
        watcher.cancel()
        assert most == 2
        for p, r in zip(prompts, results, strict=True):
            assert r.completion_token_ids == _greedy_reference(eng, p, 16)
    finally:
        eng.close_sync()
    with pytest.raises(UsageError, match="max_kv_bytes must be >= 0"):
        TorchEngineConfig(max_kv_bytes=-1)


async def test_a_request_held_back_by_the_kv_budget_joins_before_later_ones(
    tiny_path: Path,
) -> None:
    """Room for two rows: while two long generations run, a long prompt arrives, then six
    short ones. The long prompt is held and joins first when room frees, not after the
    short ones that came later (re-queued behind them, it would join first only if the
    rotation happened to leave it in front: 1 time in 7)."""
    from art_langgraph.engine import TorchEngineConfig

    probe = TorchEngine.from_pretrained(str(tiny_path), TorchEngineConfig(dtype="float32"))
    per_token = probe._inbox.kv_token_bytes
    probe.close_sync()
    long = _prompt(probe, "word " * 60)
    shorts = [_prompt(probe, f"hi {k}") for k in range(8)]
    running = SamplingParams(max_tokens=120, temperature=0, ignore_eos=True)
    quick = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    widest = max(len(shorts[0]) + 120, len(long) + 8)
    eng = TorchEngine.from_pretrained(
        str(tiny_path), TorchEngineConfig(dtype="float32", max_kv_bytes=2 * widest * per_token)
    )
    joined: list[int] = []
    prefill = eng._prefill

    def record(new: list[Any]) -> None:
        joined.extend(len(r.prompt_ids) for r in new)
        prefill(new)

    eng._prefill = record  # type: ignore[method-assign]
    try:
        first = [asyncio.create_task(eng.generate(p, running)) for p in shorts[:2]]
        while eng.active < 2:
            await asyncio.sleep(0.001)
        later = [asyncio.create_task(eng.generate(long, quick))]
        await asyncio.sleep(0.02)
        later += [asyncio.create_task(eng.generate(p, quick)) for p in shorts[2:]]
        await asyncio.gather(*first, *later)
        assert joined[2] == len(long), joined  # the first to join after the two running rows
    finally:
        eng.close_sync()


async def test_a_closed_engine_is_freed_by_its_last_reference_alone(tiny_path: Path) -> None:
    # no reference cycle through the engine: its weights and caches go when its owner drops
    # it, not at the garbage collector's next full pass (which a long process may not reach
    # for minutes, holding a real model's 1.5 GiB meanwhile)
    import gc
    import weakref

    engine = TorchEngine.from_pretrained(str(tiny_path))
    await engine.generate(_prompt(engine, "hi"), SamplingParams(max_tokens=4, temperature=0.0))
    await engine.close()
    freed = weakref.ref(engine)
    gc.disable()
    try:
        del engine
        assert freed() is None
    finally:
        gc.enable()


_IMPORTS_BY_THREAD = """
import asyncio, importlib.abc, json, sys, threading
first = {}
class Recorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        first.setdefault(name, threading.current_thread().name)
        return None
sys.meta_path.insert(0, Recorder())
from art_langgraph.engine import SamplingParams, TorchEngine, TorchEngineConfig
eng = TorchEngine.from_pretrained(sys.argv[1], TorchEngineConfig(dtype="float32"))
built = sorted(sys.modules)
tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
async def main():
    ids = eng.tokenizer.encode("hello")
    forced = SamplingParams(max_tokens=8, grammar=eng.grammars.tool_calls([tool]))
    await eng.generate(ids, forced)
    await eng.load_adapter("a", sys.argv[2])
    await eng.generate(ids, SamplingParams(max_tokens=8, temperature=0), adapter="a")
    await eng.unload_adapter("a")
asyncio.run(main())
eng.close_sync()
print(json.dumps({"first": first, "built": built}))
"""


def test_the_worker_imports_no_part_of_torch_or_its_libraries_first(
    tiny_path: Path, lora_adapter: Path
) -> None:
    """The worker thread's first grammar, adapter load and adapter batch import nothing of
    torch, transformers, llguidance or peft that the building thread had not: a first import
    on the worker while the caller's thread imported other parts of torch met half-made
    modules ("grammar warm-up failed"). A fresh process: this one imported them long ago."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_BY_THREAD, str(tiny_path), str(lora_adapter)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert {"llguidance.torch", "peft.peft_model"} <= set(seen["built"])
    roots = ("torch", "functorch", "transformers", "llguidance", "peft.tuners", "peft.peft_model")
    on_worker = [n for n, t in seen["first"].items() if t != "MainThread" and n.startswith(roots)]
    assert on_worker == []
