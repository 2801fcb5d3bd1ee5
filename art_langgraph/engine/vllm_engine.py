"""`VLLMEngine`: the `InferenceEngine` contract on a vLLM OpenAI server run as a managed subprocess.

vLLM runs from its own virtualenv (`scripts/setup-vllm.sh` makes `.venv-vllm`; its pins
never meet ours) as `python -m vllm.entrypoints.openai.api_server` on a free loopback
port, with LoRA enabled. Our server stays the one front door: it renders chat templates,
parses tool calls, resolves `name@step` and checks every request; this engine only
speaks token ids to vLLM's `/v1/completions` (`prompt` as a list of ids,
`return_token_ids`, raw logprobs, top alternatives as ids via
`return_tokens_as_token_ids`). Constraints (forced tool calls, `response_format`) are
our llguidance grammars, handed to vLLM's structured outputs (its `guidance` backend).

vLLM's automatic prefix caching is on (`VLLMEngineConfig.prefix_caching`): the next turn
of an agent's conversation prefills only its new tokens. vLLM keys cached blocks by
adapter name and folder, so a new step never reuses an old step's KV. Each result's
`cached_tokens` is vLLM's `usage.prompt_tokens_details.cached_tokens`. `metrics()` is
cheap: token and prefix-cache counters kept here (they outlive a vLLM restart), and the
running/waiting gauges from vLLM's own `/metrics`, re-read in the background at most
every `metrics_refresh_s`.

Adapters are loaded in place (`/v1/load_lora_adapter`, `load_inplace`) and then
verified: vLLM must list the adapter with the new folder as its root, or the load fails
loudly (`InfrastructureError`), so a step never silently serves the old weights.

The subprocess: its log goes to `log_path`; start-up waits for `/health` (a clear error
with the log's tail if it dies or times out); a request that finds it dead restarts it
once (reloading the adapters it held) and retries; `close()` stops it. Its TMPDIR is a
folder of its own, deleted when it stops (vLLM leaves a `vllm_dist_*` folder and unix
sockets there at every start); torch's compile cache stays where torch keeps it. It dies
with the process that started it, however that process ends (`close()` forgotten,
SIGKILL): vLLM runs under a small watchdog (`watchdog.py`, its session leader)
that holds the read end of a pipe whose write end only our process holds; the kernel
closes it when we die, and on EOF the watchdog stops vLLM and kills what is left of its
process group (the engine core). Not the parent-death signal: it fires when the *thread*
that spawned the child ends, and we start vLLM from worker threads (`asyncio.to_thread`).

Left out: vLLM's own multi-GPU flags (pass them through `engine_args`), pipelined
streaming of several choices per request (one request per choice, as our torch engine
does), vLLM's per-request timings (`timings` holds only the total), the prefix cache's
size and evictions (vLLM does not report them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from art_langgraph.engine.base import (
    EngineMetrics,
    EngineTraits,
    GenerateResult,
    SamplingParams,
    TokenEvent,
)
from art_langgraph.engine.vllm_config import (
    VLLMEngineConfig,
    inductor_cache_dir,
    lora_size,
    preload_libs,
    vllm_dtype,
    vllm_python,
)
from art_langgraph.errors import ContextLengthError, InfrastructureError, UsageError
from art_langgraph.runtime.event_loops import PerLoop
from art_langgraph.runtime.watchdog import WATCHDOG, WatchedProcess

log = logging.getLogger(__name__)


_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class _Counts:
    """What `VLLMEngine.metrics()` reports, updated from the requests' event loops and read
    by scrapes (hence the lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt_tokens = self.generation_tokens = 0
        self.cache_queries = self.cache_hits = 0
        self.in_flight = 0
        self.vllm_gauges: tuple[int, int] | None = None
        """(running, waiting) at the last reading of vLLM's /metrics; None: none yet, or it failed."""
        self.kv_bytes = 0
        """vLLM's KV cache in bytes, read from its /metrics (0 until then)."""
        self.read_at = -1e9
        self.reading = False

    @contextlib.contextmanager
    def request(self, prompt_tokens: int) -> Iterator[_Request]:
        with self.lock:
            self.prompt_tokens += prompt_tokens
            self.in_flight += 1
        try:
            yield _Request(self, prompt_tokens)
        finally:
            with self.lock:
                self.in_flight -= 1

    def generated(self, n: int) -> None:
        with self.lock:
            self.generation_tokens += n


@dataclass
class _Request:
    counts: _Counts
    prompt_tokens: int

    def cached(self, hits: int) -> int:
        """Count this request's prefix-cache lookup (`hits` of its prompt tokens); returns `hits`."""
        with self.counts.lock:
            self.counts.cache_queries += self.prompt_tokens
            self.counts.cache_hits += hits
        return hits


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VLLMEngine:
    """An `InferenceEngine` over a managed vLLM server. Build it with `start`."""

    def __init__(
        self, base_path: str, config: VLLMEngineConfig, log_path: Path, lora_rank: int = 8
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer

        from art_langgraph.engine.constrained import GrammarCompiler

        self.base_path, self.config, self.log_path = base_path, config, log_path
        self.tokenizer = AutoTokenizer.from_pretrained(base_path)
        if config.chat_template is not None:
            from art_langgraph.chat.templates import load_chat_template

            self.tokenizer.chat_template = load_chat_template(config.chat_template)
        hf = AutoConfig.from_pretrained(base_path)
        self.vocab_size = int(hf.vocab_size)
        native = int(getattr(hf, "max_position_embeddings", 0) or 2048)
        self.context_length = int(config.max_model_len or native)
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size)
        self.served_base = "base"
        self.max_lora_rank = config.max_lora_rank or lora_size(lora_rank)
        self._adapters: dict[str, str] = {}
        self._child = WatchedProcess("vLLM", self.log_path)
        self._url = ""
        self._counts = _Counts()
        self._restart_lock = threading.Lock()
        self._clients: PerLoop[httpx.AsyncClient] = PerLoop(
            lambda: httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0))
        )

    # ------------------------------------------------------------------ process
    @classmethod
    def start(
        cls,
        base_path: str,
        config: VLLMEngineConfig | None,
        log_path: Path,
        lora_rank: int = 8,
    ) -> VLLMEngine:
        """Start vLLM for `base_path`; `lora_rank`: the adapters' rank (sizes --max-lora-rank)."""
        engine = cls(base_path, config or VLLMEngineConfig(), log_path, lora_rank)
        engine._spawn()
        return engine

    def _command(self, port: int) -> tuple[list[str], dict[str, str]]:
        py = self.config.python or vllm_python()
        if py is not None and not Path(py).exists():
            raise UsageError(f"vLLM's Python {py} does not exist: run scripts/setup-vllm.sh")
        if py is None:
            raise UsageError(
                "vLLM is not installed: run scripts/setup-vllm.sh (it makes .venv-vllm), or set "
                "$ART_VLLM_PYTHON to a Python that has vllm"
            )
        cmd = [
            str(py), "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.base_path, "--served-model-name", self.served_base,
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", vllm_dtype(self.config.dtype), "--max-model-len", str(self.context_length),
            "--enable-lora", "--max-loras", str(self.config.max_loras),
            "--max-lora-rank", str(self.max_lora_rank),
            "--structured-outputs-config", json.dumps({"backend": "guidance"}),
            "--enable-prefix-caching" if self.config.prefix_caching
            else "--no-enable-prefix-caching",
            "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
            "--disable-uvicorn-access-log",
            *self.config.engine_args,
        ]  # fmt: skip
        env = {
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(self.config.kv_cache_gib))),
            "PYTHONUNBUFFERED": "1",
            **self.config.extra_env,
        }
        env.pop("PYTHONPATH", None)  # our packages must not shadow vLLM's pins
        # vLLM's TMPDIR is a scratch folder deleted when it stops (`_spawn`); torch's compile
        # cache stays where torch keeps it by default, so a new start still finds it
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache_dir())
        if self.config.cpu_threads_bind == "auto":
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
        elif self.config.cpu_threads_bind:
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", self.config.cpu_threads_bind)
        if self.config.preload and (libs := preload_libs(Path(py).parent.parent)):
            env["LD_PRELOAD"] = ":".join([*libs, env.get("LD_PRELOAD", "")]).rstrip(":")
        return cmd, env

    def _spawn(self) -> None:
        port = _free_port()
        cmd, env = self._command(port)
        self._url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(self._url + "/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        self._child.start(
            lambda fd: [cmd[0], "-c", WATCHDOG, str(fd), *cmd],
            env,
            " ".join(cmd),
            ready=healthy,
            timeout_s=self.config.startup_timeout_s,
            poll_s=0.25,
            scratch=True,  # vLLM leaves a folder and sockets in TMPDIR at every start
        )
        log.info("vLLM serves %s on %s", self.base_path, self._url)

    def _stop(self) -> None:
        self._child.stop(grace_s=30)  # SIGTERM: the watchdog passes it on, vLLM stops its core

    def alive(self) -> bool:
        return self._child.alive()

    @property
    def weights_dtype(self) -> str:
        """The dtype vLLM holds the weights in: the one given, float32 where `auto` keeps
        vLLM off bfloat16 (a CPU without it in hardware), else bfloat16. An embedded
        backend's trainer takes it for its own `auto`."""
        chosen = vllm_dtype(self.config.dtype)
        return "bfloat16" if chosen == "auto" else chosen

    async def _restart(self) -> None:
        """Start vLLM again (it died) and reload the adapters it held."""
        log.warning("vLLM is gone (exit code %s); restarting it", self._child.returncode)
        await asyncio.to_thread(self._restart_sync)
        for name, path in list(self._adapters.items()):
            await self._load(name, path)

    def _restart_sync(self) -> None:
        with self._restart_lock:
            if not self.alive():
                self._stop()
                self._spawn()

    async def close(self) -> None:
        await asyncio.to_thread(self._stop)

    def close_sync(self) -> None:
        self._stop()

    # ----------------------------------------------------------------- requests
    def _http(self) -> httpx.AsyncClient:
        return self._clients.get()

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST to vLLM; a dead server is restarted once and the request retried."""
        for attempt in (0, 1):
            try:
                return await self._http().post(self._url + path, json=body)
            except httpx.TransportError as exc:
                if attempt == 0 and not self.alive():
                    await self._restart()
                    continue
                raise InfrastructureError(f"vLLM did not answer {path}: {exc!r}") from None
        raise AssertionError("unreachable")

    def _body(
        self, prompt_ids: Sequence[int], s: SamplingParams, adapter: str | None, stream: bool
    ) -> dict[str, Any]:
        if len(prompt_ids) >= self.context_length:
            raise ContextLengthError(len(prompt_ids), None, self.context_length)
        if adapter is not None and adapter not in self._adapters:
            raise UsageError(f"adapter {adapter!r} is not loaded")
        try:
            prompt = [int(i) for i in prompt_ids]
        except (TypeError, ValueError):
            raise UsageError("prompt_ids must be token ids (integers)") from None
        body: dict[str, Any] = {
            "model": adapter or self.served_base,
            "prompt": prompt,
            "max_tokens": min(s.max_tokens, self.context_length - len(prompt_ids)),
            "temperature": s.temperature,
            "top_p": s.top_p,
            "logprobs": max(1, s.top_logprobs),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "ignore_eos": s.ignore_eos,
            "stream": stream,
        }
        if s.stop:
            body["stop"] = list(s.stop)
        if s.stop_token_ids:
            body["stop_token_ids"] = list(s.stop_token_ids)
        if s.seed is not None:
            body["seed"] = s.seed % 2**63
        if s.grammar is not None:
            body["structured_outputs"] = {"grammar": to_lark(s.grammar)}
        return body

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None = None
    ) -> GenerateResult:
        t0 = time.perf_counter()
        body = self._body(prompt_ids, sampling, adapter, False)
        with self._counts.request(len(body["prompt"])) as request:
            r = await self._post("/v1/completions", body)
            data = _json_or_error(r)
            cached = request.cached(_cached_tokens(data))
        choice = data["choices"][0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        lp = choice.get("logprobs") or {}
        logprobs = [float(x) for x in lp.get("token_logprobs") or []]
        if len(logprobs) != len(ids):
            raise InfrastructureError(
                f"vLLM returned {len(ids)} token ids but {len(logprobs)} logprobs"
            )
        tops = _tops(lp.get("top_logprobs"), sampling.top_logprobs)
        self._counts.generated(len(ids))
        return GenerateResult(
            prompt_token_ids=list(prompt_ids),
            completion_token_ids=ids,
            logprobs=logprobs,
            finish_reason=_finish(choice.get("finish_reason")),
            stop_reason=choice.get("stop_reason"),
            top_logprobs=tops,
            adapter=adapter,
            timings={"total": time.perf_counter() - t0},
            cached_tokens=cached,
        )

    async def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, adapter: str | None = None
    ) -> AsyncIterator[TokenEvent | GenerateResult]:
        body = self._body(prompt_ids, sampling, adapter, True)
        if not self.alive():
            await self._restart()
        ids: list[int] = []
        logprobs: list[float] = []
        tops_all: list[list[tuple[int, float]]] = []
        finish, stop_reason, cached = None, None, 0
        body["stream_options"] = {"include_usage": True}  # a last chunk with the usage
        url = self._url + "/v1/completions"
        try:
            with self._counts.request(len(body["prompt"])) as request:
                async with self._http().stream("POST", url, json=body) as r:
                    if r.status_code != 200:
                        _json_or_error(httpx.Response(r.status_code, content=await r.aread()))
                    async for line in r.aiter_lines():
                        if not line.startswith("data:") or line.strip() == "data: [DONE]":
                            continue
                        chunk = json.loads(line[5:])
                        if chunk.get("usage"):
                            cached = request.cached(_cached_tokens(chunk))
                        for event in self._events(chunk, sampling, ids, logprobs, tops_all):
                            yield event
                        for choice in chunk.get("choices") or []:
                            if choice.get("finish_reason"):
                                finish = choice["finish_reason"]
                                stop_reason = choice.get("stop_reason")
        except httpx.TransportError as exc:
            raise InfrastructureError(f"vLLM's stream broke: {exc!r}") from None
        yield GenerateResult(
            prompt_token_ids=list(prompt_ids),
            completion_token_ids=ids,
            logprobs=logprobs,
            finish_reason=_finish(finish),
            stop_reason=stop_reason,
            top_logprobs=tops_all if sampling.top_logprobs else None,
            adapter=adapter,
            cached_tokens=cached,
        )

    def _events(
        self,
        chunk: dict[str, Any],
        sampling: SamplingParams,
        ids: list[int],
        logprobs: list[float],
        tops_all: list[list[tuple[int, float]]],
    ) -> list[TokenEvent]:
        """One streamed chunk's tokens as events, appended to `ids`, `logprobs`, `tops_all`."""
        events = []
        for choice in chunk.get("choices") or []:
            new = [int(t) for t in choice.get("token_ids") or []]
            lp = choice.get("logprobs") or {}
            lps = [float(x) for x in lp.get("token_logprobs") or []]
            tops = _tops(lp.get("top_logprobs"), sampling.top_logprobs)
            for k, t in enumerate(new):
                top = tops[k] if tops is not None and k < len(tops) else None
                ids.append(t)
                logprobs.append(lps[k] if k < len(lps) else float("nan"))
                if top is not None:
                    tops_all.append(top)
                events.append(TokenEvent(t, logprobs[-1], top))
        self._counts.generated(len(events))
        return events

    # ----------------------------------------------------------------- adapters
    async def load_adapter(self, name: str, path: str) -> None:
        """Load (or replace, in place) adapter `name` from `path`, then check vLLM serves it."""
        await self._load(name, path)
        self._adapters[name] = path

    async def _load(self, name: str, path: str) -> None:
        body = {"lora_name": name, "lora_path": str(path), "load_inplace": True}
        r = await self._post("/v1/load_lora_adapter", body)
        if r.status_code != 200:
            raise InfrastructureError(
                f"vLLM refused to load adapter {name!r} from {path}: {r.status_code} {r.text[:500]}"
            )
        models = _json_or_error(await self._http().get(self._url + "/v1/models"))
        roots = {m.get("id"): m.get("root") for m in models.get("data", [])}
        if name not in roots or str(roots[name]) != str(path):
            raise InfrastructureError(
                f"vLLM did not take adapter {name!r} from {path}: it lists {roots.get(name)!r}; "
                "the old weights would be served, so the step fails"
            )

    async def unload_adapter(self, name: str) -> None:
        self._adapters.pop(name, None)
        r = await self._post("/v1/unload_lora_adapter", {"lora_name": name})
        if r.status_code not in (200, 404):
            log.warning("vLLM could not unload %s: %s %s", name, r.status_code, r.text[:200])

    def list_adapters(self) -> list[str]:
        return list(self._adapters)

    @property
    def traits(self) -> EngineTraits:
        """vLLM's weights dtype and its `--max-lora-rank`; its weights live in its own
        process, so a trainer loads its own copy."""
        return EngineTraits(weights_dtype=self.weights_dtype, max_lora_rank=self.max_lora_rank)

    async def reset_prefix_cache(self) -> None:
        """Nothing: vLLM keys its cached blocks by the LoRA adapter they were computed under
        (each step's adapter has a name of its own), and its KV memory is allocated once
        at start, so dropping it would free nothing for the trainer."""

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> EngineMetrics:
        """Token and prefix-cache counters kept here (exact for our requests, the only ones
        this vLLM serves, and unbroken by a restart); running and waiting from vLLM's own
        /metrics, at most `metrics_refresh_s` old (before its first reading, or while vLLM
        is down: our requests in flight as running, 0 waiting). Always 0: the prefix
        cache's evictions and bytes held (vLLM does not report them). Capacity: vLLM's
        whole KV cache, which the prefix cache shares, once read from vLLM (0 when
        `prefix_caching` is off)."""
        c = self._counts
        alive = self.alive()
        if alive:
            self._refresh_gauges()
        with c.lock:
            gauges = c.vllm_gauges if alive else None
            running, waiting = gauges or (c.in_flight, 0)
            return EngineMetrics(
                prompt_tokens=c.prompt_tokens,
                generation_tokens=c.generation_tokens,
                prefix_cache_queries=c.cache_queries if self.config.prefix_caching else 0,
                prefix_cache_hits=c.cache_hits,
                prefix_cache_capacity_bytes=c.kv_bytes if self.config.prefix_caching else 0,
                running=running,
                waiting=waiting,
            )

    def _refresh_gauges(self) -> None:
        """Re-read vLLM's /metrics in a background thread if the last reading is stale."""
        c = self._counts
        now = time.monotonic()
        with c.lock:
            if c.reading or now - c.read_at < self.config.metrics_refresh_s:
                return
            c.reading, c.read_at = True, now
        threading.Thread(target=self._read_gauges, name="vllm-metrics", daemon=True).start()

    def _read_gauges(self) -> None:
        c = self._counts
        gauges, kv_bytes = None, 0
        try:
            text = httpx.get(self._url + "/metrics", timeout=5).raise_for_status().text
            values = _prometheus(text, _GAUGES)
            gauges = (int(values[_GAUGES[0]]), int(values[_GAUGES[1]]))
            kv_bytes = _kv_cache_bytes(text)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            log.debug("could not read vLLM's /metrics: %r", exc)
        with c.lock:
            c.reading, c.vllm_gauges = False, gauges
            c.kv_bytes = kv_bytes or c.kv_bytes


def to_lark(grammar: str) -> str:
    """Our llguidance grammar (`engine.constrained`) as the Lark text vLLM's `guidance`
    backend takes: Lark stays Lark; a serialized JSON-schema or regex grammar becomes the
    Lark rule that means the same (`%json {schema}` keeps its `x-guidance` settings)."""
    if not grammar.lstrip().startswith("{"):
        return grammar
    spec = json.loads(grammar)
    parts = spec.get("grammars") or []
    if len(parts) != 1:
        raise UsageError("vLLM takes one grammar per request")
    part = parts[0]
    if part.get("lark_grammar"):
        return str(part["lark_grammar"])
    if part.get("json_schema") is not None:
        return "start: %json " + json.dumps(part["json_schema"]) + "\n"
    raise UsageError(f"cannot hand this grammar to vLLM: {grammar[:200]}")


def _json_or_error(r: httpx.Response) -> dict[str, Any]:
    try:
        data = r.json()
    except ValueError:
        data = {}
    if r.status_code == 200 and isinstance(data, dict):
        return data
    message = (data.get("error") or {}).get("message") if isinstance(data, dict) else None
    message = message or r.text[:500]
    if 400 <= r.status_code < 500:
        raise UsageError(f"vLLM: {message}")
    raise InfrastructureError(f"vLLM answered {r.status_code}: {message}")


def _tops(raw: Any, k: int) -> list[list[tuple[int, float]]] | None:
    """vLLM's top_logprobs (dicts keyed "token_id:N" with return_tokens_as_token_ids)."""
    if not k or not raw:
        return None
    out = []
    for pos in raw:
        pairs = sorted(
            ((int(str(t).rpartition(":")[2]), float(v)) for t, v in (pos or {}).items()),
            key=lambda p: -p[1],
        )
        out.append(pairs[:k])
    return out


def _cached_tokens(data: dict[str, Any]) -> int:
    """`usage.prompt_tokens_details.cached_tokens` of a vLLM response (0 when absent)."""
    details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _prometheus(text: str, names: Sequence[str]) -> dict[str, float]:
    """The values of the samples `names` in Prometheus text, summed over their labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{", 1)[0]
        if name in names:
            out[name] = out.get(name, 0.0) + float(value)
    return out


def _kv_cache_bytes(text: str) -> int:
    """The KV cache's size in vLLM's /metrics (`vllm:cache_config_info`'s
    `kv_cache_memory_bytes`, set on CPUs from VLLM_CPU_KVCACHE_SPACE); 0 where vLLM
    reports None (it may on GPUs, where it sizes the cache by `gpu_memory_utilization`;
    not checked on one)."""
    m = re.search(r'^vllm:cache_config_info\{.*?kv_cache_memory_bytes="(\d+)"', text, re.M)
    return int(m.group(1)) if m else 0


def _finish(reason: Any) -> Any:
    return reason if reason in ("stop", "length") else "abort" if reason is None else "stop"
