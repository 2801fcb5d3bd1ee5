"""Usage as OpenAI reports it (`prompt_tokens_details.cached_tokens`) and `GET /metrics`
(Prometheus text, as vLLM serves it), on the real server with the real `openai` client.

`/metrics` is read with a small strict parser of the text format: every sample line is
`name{labels} value`, every family has its `# HELP` and `# TYPE` before its samples."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

import art_langgraph as art
from art_langgraph.backend.api.server import create_backend_app
from art_langgraph.engine import TorchEngine
from art_langgraph.engine.base import GenerateResult
from art_langgraph.runtime.http_pool import async_http_client
from art_langgraph.serving import ModelRegistry, ServerHandle
from art_langgraph.serving.chat_service import ChatService
from art_langgraph.serving.config import ServerConfig
from art_langgraph.serving.metrics import TokenRates
from art_langgraph.serving.runner import start_app_server
from tests.conftest import API_KEY

USER: list[Any] = [{"role": "user", "content": "Say something."}]
# A long, fixed system prompt (well over 200 tokens with the tiny tokenizer): a prefix
# cache serves a repeat of it.
SYSTEM = " ".join(f"Rule {i}: answer briefly, politely and in plain words." for i in range(30))
LONG: list[Any] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Hello there."},
]

FAMILIES = {
    "art:prompt_tokens_total": "counter",
    "art:generation_tokens_total": "counter",
    "art:prefix_cache_queries_total": "counter",
    "art:prefix_cache_hits_total": "counter",
    "art:prefix_cache_hit_rate": "gauge",
    "art:prefix_cache_evictions_total": "counter",
    "art:prefix_cache_usage_bytes": "gauge",
    "art:prefix_cache_capacity_bytes": "gauge",
    "art:num_requests_running": "gauge",
    "art:num_requests_waiting": "gauge",
    "art:avg_prompt_throughput_toks_per_s": "gauge",
    "art:avg_generation_throughput_toks_per_s": "gauge",
}


# ---------------------------------------------------------------- the parser
@dataclass
class Family:
    help: str | None = None
    type: str | None = None
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
_VALUE = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|Inf|NaN)"


def parse_prometheus(text: str) -> dict[str, Family]:
    """The text exposition format 0.0.4, strictly: fails on any line it does not expect."""
    assert text.endswith("\n"), "the body must end with a newline"
    families: dict[str, Family] = {}
    for n, line in enumerate(text[:-1].split("\n"), 1):
        if line.startswith(("# HELP ", "# TYPE ")):
            m = re.fullmatch(rf"# HELP ({_NAME}) (.+)", line) or re.fullmatch(
                rf"# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)", line
            )
            assert m, f"line {n}: malformed {line[:6]!r} line: {line!r}"
            fam = families.setdefault(m[1], Family())
            assert not fam.samples, f"line {n}: {line[:6]} of {m[1]} after its samples"
            attr = "help" if line.startswith("# HELP") else "type"
            assert getattr(fam, attr) is None, f"line {n}: a second {line[:6]} for {m[1]}"
            setattr(fam, attr, m[2])
            continue
        assert not line.startswith("#"), f"line {n}: an unexpected comment {line!r}"
        m = re.fullmatch(rf"({_NAME})\{{(.*)\}} ({_VALUE})", line)
        assert m, f"line {n}: not `name{{labels}} value`: {line!r}"
        fam = families.get(m[1], Family())
        assert fam.help is not None and fam.type is not None, f"line {n}: {m[1]} lacks HELP/TYPE"
        fam.samples.append((_labels(m[2], n), float(m[3])))
    for name, fam in families.items():
        assert fam.help and fam.type and fam.samples, f"{name}: HELP, TYPE and a sample each"
        if fam.type == "counter":
            assert name.endswith("_total"), f"{name}: a counter's name ends in _total"
            assert all(v >= 0 for _, v in fam.samples), f"{name}: a counter is never negative"
    return families


def _labels(text: str, n: int) -> dict[str, str]:
    assert re.fullmatch(rf"(?:{_LABEL}(?:,{_LABEL})*)?", text), f"line {n}: bad labels {text!r}"
    pairs = [(k, v) for k, v in re.findall(_LABEL, text)]
    assert len({k for k, _ in pairs}) == len(pairs), f"line {n}: a label repeated"
    return dict(pairs)


def test_the_parser_is_strict() -> None:
    good = '# HELP a:b_total Things.\n# TYPE a:b_total counter\na:b_total{m="x\\"y"} 3\n'
    assert parse_prometheus(good)["a:b_total"].samples == [({"m": 'x\\"y'}, 3.0)]
    bad = [
        good.removesuffix("\n"),  # no final newline
        good.replace("# HELP a:b_total Things.\n", ""),  # no HELP
        good.replace("# TYPE a:b_total counter\n", ""),  # no TYPE
        good.replace(" 3\n", " three\n"),  # not a number
        good.replace("{", "").replace("}", ""),  # not name{labels} value
        good.replace('m="x\\"y"', "m=x"),  # unquoted label
        good + "\n",  # a blank line
        good.replace("a:b_total counter", "a:b counter").replace("a:b_total{", "a:b{"),
    ]
    for text in bad:
        with pytest.raises(AssertionError):
            parse_prometheus(text)


# ------------------------------------------------------------------- helpers
@pytest.fixture
def client(server: ServerHandle) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=server.base_url, api_key="unused", max_retries=0, http_client=async_http_client()
    )


def _root(handle: ServerHandle) -> str:
    return handle.base_url.removesuffix("/v1")


async def _scrape(url: str, key: str | None = None) -> dict[str, float]:
    """`/metrics` parsed; each family's one sample (labelled with the served model)."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{url}/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = parse_prometheus(r.text)
    out = {}
    for name, fam in families.items():
        ((labels, value),) = fam.samples
        assert labels == {"model_name": "tiny"}
        out[name] = value
    return out


# --------------------------------------------------------------------- usage
async def test_usage_has_cached_tokens_and_counts_the_prompt_once(client: AsyncOpenAI) -> None:
    kw: dict[str, Any] = {"model": "tiny", "messages": USER, "max_tokens": 6, "seed": 3}
    raw = await client.chat.completions.with_raw_response.create(
        **kw, n=3, extra_body={"return_token_ids": True}
    )
    r = raw.parse()
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens == len(r.model_extra["prompt_token_ids"])  # type: ignore[index]
    assert r.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in r.choices)  # type: ignore[index]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and 0 <= cached <= r.usage.prompt_tokens
    # OpenAI's shape on the wire: `usage.prompt_tokens_details.cached_tokens`.
    assert set(raw.http_response.json()["usage"]["prompt_tokens_details"]) == {"cached_tokens"}

    stream = await client.chat.completions.create(
        **kw,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    chunks = [c async for c in stream]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    streamed = sum(
        len((c.model_extra or {}).get("token_ids") or []) for x in chunks for c in x.choices
    )
    assert last.usage.prompt_tokens == r.usage.prompt_tokens  # once, not once per choice
    assert last.usage.completion_tokens == streamed
    assert last.usage.total_tokens == last.usage.prompt_tokens + streamed
    details = last.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert 0 <= details.cached_tokens <= last.usage.prompt_tokens


async def test_with_n_choices_cached_is_the_fewest_any_choice_had(
    engine: TorchEngine, registry: ModelRegistry
) -> None:
    service = ChatService(engine, registry, ServerConfig())
    body = {"model": "tiny", "messages": USER, "max_tokens": 2, "n": 3}
    plan = service.plan(service.parse(json.dumps(body).encode()))
    n = len(plan.prompt_ids)
    results = [
        GenerateResult(plan.prompt_ids, [5] * k, [-1.0] * k, "length", cached_tokens=c)
        for k, c in ((1, n - 1), (2, 0), (2, n - 1))  # the second choice ran first
    ]
    usage = service.response(plan, results).usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (n, 5, n + 5)
    assert usage.prompt_tokens_details.cached_tokens == 0


async def test_a_repeated_long_prompt_is_served_from_the_prefix_cache(
    client: AsyncOpenAI, server: ServerHandle
) -> None:
    kw: dict[str, Any] = {"model": "tiny", "messages": LONG, "max_tokens": 4, "temperature": 0}
    first = await client.chat.completions.create(**kw)
    assert first.usage is not None and first.usage.prompt_tokens >= 200
    before = await _scrape(_root(server))
    again = await client.chat.completions.create(**kw)
    after = await _scrape(_root(server))
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and 0 < cached <= again.usage.prompt_tokens
    hits = after["art:prefix_cache_hits_total"] - before["art:prefix_cache_hits_total"]
    queries = after["art:prefix_cache_queries_total"] - before["art:prefix_cache_queries_total"]
    assert hits == cached and queries >= hits
    assert 0 < after["art:prefix_cache_hit_rate"] <= 1
    assert 0 < after["art:prefix_cache_usage_bytes"] <= after["art:prefix_cache_capacity_bytes"]
    # The same in the stream's usage chunk.
    stream = await client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}
    )
    usage = [c.usage async for c in stream][-1]
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) > 0


# ------------------------------------------------------------------- /metrics
async def test_metrics_is_prometheus_text_with_every_family(server: ServerHandle) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{_root(server)}/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = parse_prometheus(r.text)
    assert {name: fam.type for name, fam in families.items()} == FAMILIES
    values = await _scrape(_root(server))
    assert all(v >= 0 for v in values.values())
    assert values["art:prefix_cache_hit_rate"] <= 1


async def test_running_requests_show_in_the_gauges(
    client: AsyncOpenAI, server: ServerHandle
) -> None:
    stream = await client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:  # a sampled token: the request is decoding
        if chunk.choices and chunk.choices[0].delta.content:
            break
    during = await _scrape(_root(server))
    await stream.close()  # the server cancels the rest
    assert during["art:num_requests_running"] + during["art:num_requests_waiting"] >= 1
    for _ in range(200):  # the engine retires the cancelled row at its next step
        after = await _scrape(_root(server))
        if after["art:num_requests_running"] == 0:
            break
        await asyncio.sleep(0.05)
    assert after["art:num_requests_running"] == 0 and after["art:num_requests_waiting"] == 0


async def test_token_counters_and_throughput_move_after_a_request(
    client: AsyncOpenAI, server: ServerHandle
) -> None:
    before = await _scrape(_root(server))  # starts the sampler, if no scrape did yet
    r = await client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=8, seed=4, extra_body={"ignore_eos": True}
    )
    after = await _scrape(_root(server))
    assert r.usage is not None
    prompt = after["art:prompt_tokens_total"] - before["art:prompt_tokens_total"]
    generated = after["art:generation_tokens_total"] - before["art:generation_tokens_total"]
    assert prompt == r.usage.prompt_tokens and generated == r.usage.completion_tokens == 8
    assert after["art:avg_prompt_throughput_toks_per_s"] > 0
    assert after["art:avg_generation_throughput_toks_per_s"] > 0


def test_throughput_is_the_counters_growth_over_the_window() -> None:
    rates = TokenRates(window_s=10, tick_s=1)
    assert rates.rates(0, 0, 0).prompt == 0  # nothing sampled yet
    rates.observe(0, 100, 10)
    assert rates.rates(0, 100, 10).generation == 0  # no time has passed
    assert (rates.rates(4, 300, 30).prompt, rates.rates(4, 300, 30).generation) == (50, 5)
    for t in range(1, 26):  # 40 prompt and 4 generation tokens a second from t=0
        rates.observe(t, 100 + 40 * t, 10 + 4 * t)
    rates.observe(25.2, 0, 0)  # under half a tick after the last sample: not kept
    now = rates.rates(25.5, 100 + 40 * 25 + 600, 10 + 4 * 25)  # 600 more in the last 0.5 s
    # Measured since t=15, the newest sample at least 10 s old: 10.5 s.
    assert now.prompt == pytest.approx((40 * 10 + 600) / 10.5)
    assert now.generation == pytest.approx(4 * 10 / 10.5)


# ---------------------------------------------------------------------- auth
async def test_metrics_follows_the_api_key_rules_of_v1_models(
    keyed_server: ServerHandle, server: ServerHandle
) -> None:
    root = _root(keyed_server)
    async with httpx.AsyncClient(timeout=30) as http:
        for header in ("", "Bearer wrong", "Basic " + API_KEY, API_KEY):
            headers = {"authorization": header} if header else {}
            models = await http.get(f"{root}/v1/models", headers=headers)
            metrics = await http.get(f"{root}/metrics", headers=headers)
            assert models.status_code == metrics.status_code == 401, header
            assert metrics.json() == models.json()  # the same OpenAI error body
        for header in ("Bearer " + API_KEY, "bearer  " + API_KEY):
            models = await http.get(f"{root}/v1/models", headers={"authorization": header})
            metrics = await http.get(f"{root}/metrics", headers={"authorization": header})
            assert models.status_code == metrics.status_code == 200, header
        # A keyless server answers loopback names only, on every path.
        evil = {"host": "evil.example"}
        keyless = await http.get(f"{_root(server)}/metrics", headers=evil)
        assert keyless.status_code == 421
    await _scrape(root, API_KEY)


@pytest.fixture
def backend_app() -> Iterator[tuple[str, art.LocalBackend]]:
    with tempfile.TemporaryDirectory() as d:
        local = art.LocalBackend(Path(d), server=art.ServerChoice(api_key=API_KEY, http=False))
        with start_app_server(create_backend_app(local, api_key=API_KEY)) as handle:
            yield f"http://127.0.0.1:{handle.port}", local
        asyncio.run(local.close())


async def test_the_backend_server_serves_metrics_too(
    backend_app: tuple[str, art.LocalBackend],
) -> None:
    url, _ = backend_app
    key = {"authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(timeout=60) as http:
        assert (await http.get(f"{url}/metrics", headers=key)).status_code == 503  # no model yet
        model = art.TrainableModel(name="metered", project="m", base_model="tiny")
        await model.register(art.RemoteBackend(url, api_key=API_KEY))
        assert (await http.get(f"{url}/metrics")).status_code == 401
        r = await http.get(f"{url}/metrics", headers=key)
    assert r.status_code == 200
    assert {n: f.type for n, f in parse_prometheus(r.text).items()} == FAMILIES
