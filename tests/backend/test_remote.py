"""`RemoteBackend` against the real backend server (`art-langgraph backend`, a subprocess on a
free loopback port): training, progress, idempotent retries, a SIGKILL mid-step, keys,
and bad uploads (those against the same app in-process, with small limits)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import art_langgraph as art
from art_langgraph.backend.api.server import BackendServerConfig, create_backend_app
from art_langgraph.backend.api.wire import ModelSpec, TrainRequest, encode_body, idempotency_key
from art_langgraph.backend.remote import BackendUnavailableError
from art_langgraph.serving.runner import start_app_server
from tests.backend.rollouts import rollout

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-remote-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Backend:
    """`art-langgraph backend` in a subprocess; its log goes to a file (read on failure)."""

    def __init__(self, path: Path, port: int, api_key: str | None = KEY) -> None:
        self.path, self.port, self.api_key = path, port, api_key
        self.url = f"http://127.0.0.1:{port}"
        self.log = path / f"backend-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Backend:
        self.path.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "art_langgraph.cli", "backend", "--path", str(self.path)]
        cmd += ["--port", str(self.port), "--log-level", "warning"]
        env = {**os.environ, "ART_API_KEY": self.api_key or ""}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log, env=env)
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(self.url + "/art/v1/health", headers=headers).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the backend did not start"
            time.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def backend_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    b = Backend(tmp_path_factory.mktemp("remote"), _free_port()).start()
    yield b
    b.stop()


async def _groups(model: art.Model, n_groups: int = 2, size: int = 4) -> list[art.TrajectoryGroup]:
    groups = []
    for g in range(n_groups):
        trajs = [await rollout(model, f"count to {g}", seed=100 * g + i) for i in range(size)]
        for i, t in enumerate(trajs):
            t.reward = float(i % 2)  # a spread, so every group trains
        groups.append(art.TrajectoryGroup(trajs))
    return groups


async def test_train_through_remote_backend(backend_server: Backend) -> None:
    backend = art.RemoteBackend(backend_server.url, api_key=KEY)
    model = art.TrainableModel(name="remote-a", project="r", base_model="tiny")
    await model.register(backend)
    assert model.inference_base_url == backend_server.url + "/v1"
    assert await model.get_step() == 0
    groups = await _groups(model)
    stages: list[str] = []
    result = await model.train(
        groups, art.TrainConfig(learning_rate=2e-3), progress=lambda s, _: stages.append(s)
    )
    assert result.step == 1 and result.metrics["grad_norm"] > 0
    assert "micro_batch" in stages and "optimizer_step" in stages
    # The next request is served by the new adapter, through the same OpenAI endpoint.
    assert (await rollout(model, "after")).calls[0].model == "remote-a@1"
    assert (await rollout(model, "pinned", step=0)).calls[0].model == "remote-a@0"
    second = await model.train(groups, art.TrainConfig(learning_rate=2e-3))
    assert second.step == 2 and "replayed" not in second.metrics  # same groups, next step
    await model.log(groups, split="val")
    assert await model.delete_checkpoints("val/reward", keep_last=1) == [1]
    folder = backend_server.path / "r" / "models" / "remote-a"
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["0002"]
    assert len(art.read_groups(folder / "trajectories" / "val" / "0002.jsonl")) == 2
    # Another client (a new process, say) registering the same model resumes at step 2.
    again = art.TrainableModel(name="remote-a", project="r", base_model="tiny")
    await again.register(art.RemoteBackend(backend_server.url, api_key=KEY))
    assert await again.get_step() == 2


async def test_sft_stop_loss_crosses_the_wire(backend_server: Backend) -> None:
    model = art.TrainableModel(name="remote-sft", project="r", base_model="tiny")
    await model.register(art.RemoteBackend(backend_server.url, api_key=KEY))
    convos = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]] * 4
    with pytest.raises(art.UsageError, match="stop_loss"):  # refused before it is sent
        await model.train_sft(convos, stop_loss=-1.0)
    result = await model.train_sft(convos, epochs=3, batch_size=2, stop_loss=1e9)
    assert result.step == 1 and result.metrics["sft_epochs"] == 2  # the first never stops
    assert result.metrics["sft_steps"] == 4


async def test_a_retried_request_trains_once(backend_server: Backend) -> None:
    backend = art.RemoteBackend(backend_server.url, api_key=KEY)
    model = art.TrainableModel(name="remote-b", project="r", base_model="tiny")
    await model.register(backend)
    groups = await _groups(model)
    body = TrainRequest(
        model=ModelSpec.of(model), groups=groups, config=art.TrainConfig()
    ).model_dump_json()
    headers = {
        "authorization": f"Bearer {KEY}",
        "content-type": "application/json",
        "idempotency-key": "ab" * 16,
    }
    url = backend_server.url + "/art/v1/train"
    async with httpx.AsyncClient(timeout=120) as client:
        # A client that leaves right after its request was accepted: the step goes on.
        async with client.stream("POST", url, content=body, headers=headers) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                assert json.loads(line)["type"] == "accepted"
                break
        # Its retry, with the same id, gets that step (joined, or replayed once committed).
        events = [
            json.loads(x)
            for x in (await client.post(url, content=body, headers=headers)).text.splitlines()
        ]
        assert events[-1]["type"] == "result" and events[-1]["data"]["step"] == 1, events[-1]
        replay = [
            json.loads(x)
            for x in (await client.post(url, content=body, headers=headers)).text.splitlines()
        ]
        assert replay[-1]["data"]["step"] == 1 and replay[-1]["data"]["metrics"]["replayed"] == 1.0
    assert await model.get_step() == 1
    history = (
        (backend_server.path / "r" / "models" / "remote-b" / "history.jsonl")
        .read_text()
        .splitlines()
    )
    assert [json.loads(h)["split"] for h in history] == ["train"]


async def test_keys_and_binds(backend_server: Backend, tmp_path: Path) -> None:
    model = art.TrainableModel(name="remote-c", project="r", base_model="tiny")
    with pytest.raises(art.UsageError, match="refused the API key"):
        await model.register(art.RemoteBackend(backend_server.url, api_key="wrong"))
    async with httpx.AsyncClient() as client:
        for path in ("/art/v1/health", "/v1/models"):
            assert (await client.get(backend_server.url + path)).status_code == 401
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "art_langgraph.cli",
            "backend",
            "--host",
            "0.0.0.0",
            "--path",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "ART_API_KEY": ""},
        timeout=120,
    )
    assert out.returncode == 2 and "without an API key" in out.stderr
    with pytest.raises(BackendUnavailableError, match="is `art-langgraph backend` running"):
        await model.register(art.RemoteBackend(f"http://127.0.0.1:{_free_port()}"))


def test_the_client_never_imports_torch(backend_server: Backend, tmp_path: Path) -> None:
    """The LangGraph example, unchanged but for `--backend URL`, in a fresh process."""
    code = (
        "import sys\n"
        "from examples.langgraph_agent.agent import main\n"
        f"main(['--steps', '1', '--groups-per-step', '2', '--group-size', '2', '--out', {str(tmp_path)!r}, '--backend', {backend_server.url!r}])\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch was imported'\n"
        "print('NO-TORCH')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ART_API_KEY": KEY},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "NO-TORCH" in out.stdout and "held-out" in out.stdout
    assert json.loads((tmp_path / "report.json").read_text())["steps"] == 1
    assert not (tmp_path / ".art").exists()  # checkpoints live on the server


def test_art_mcp_trains_on_a_remote_backend(backend_server: Backend, tmp_path: Path) -> None:
    # fmt: off
    args = [
        "--server", "python -m examples.mcp_server.server",
        "--scenarios", "examples/mcp_server/scenarios.jsonl",
        "--reward", "examples.mcp_server.tasks:score",
        "--path", str(tmp_path), "--name", "mcp-remote", "--group-size", "2",
        "--groups-per-step", "2", "--sft-epochs", "1", "--max-tokens", "32",
        "--val-fraction", "0.1", "--steps", "1", "--tool-choice", "required",
        "--backend", backend_server.url, "--base-model", "tiny", "--eval-scenarios", "4",
    ]
    # fmt: on
    out = subprocess.run(
        [sys.executable, "-m", "art_mcp.cli", "train", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ART_API_KEY": KEY},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RL step 1" in out.stdout
    remote = backend_server.path / "mcp" / "models" / "mcp-remote"
    assert [p.name for p in sorted((remote / "checkpoints").iterdir())] == ["0001", "0002"]
    local = tmp_path / "mcp" / "models" / "mcp-remote"
    assert (local / "report.json").exists() and not (local / "checkpoints").exists()


async def test_sigkill_mid_step_then_retry_trains_once(tmp_path: Path) -> None:
    port = _free_port()
    server = Backend(tmp_path, port).start()
    try:
        backend = art.RemoteBackend(server.url, api_key=KEY)
        model = art.TrainableModel(name="victim", project="r", base_model="tiny")
        await model.register(backend)
        groups = await _groups(model, n_groups=4, size=8)
        # One sequence per micro-batch: the step takes 32 forward/backward passes, and the
        # backend dies at the first one's progress event, long before the step commits.
        config = art.TrainConfig(learning_rate=2e-3, micro_batch_tokens=16)
        with pytest.raises(BackendUnavailableError, match="call train again"):
            await model.train(groups, config, progress=lambda stage, _: server.kill())
        server.start()  # same port, same folder
        assert await model.get_step() == 0  # nothing was committed
        result = await model.train(groups, config)
        assert result.step == 1 and "replayed" not in result.metrics
        assert await model.get_step() == 1
        folder = tmp_path / "r" / "models" / "victim"
        lines = [json.loads(x) for x in (folder / "history.jsonl").read_text().splitlines()]
        assert [h["step"] for h in lines if h["split"] == "train"] == [1]
    finally:
        server.stop()


# ------------------------------------------------------------ in-process, small limits
@pytest.fixture(scope="module")
def small() -> Iterator[tuple[str, Path]]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        local = art.LocalBackend(d, server=art.ServerChoice(http=False))
        app = create_backend_app(
            local,
            config=BackendServerConfig(max_upload_bytes=64 * 1024, max_decoded_bytes=256 * 1024),
        )
        with start_app_server(app) as handle:
            yield f"http://127.0.0.1:{handle.port}", Path(d)
        asyncio.run(local.close())


async def test_bad_uploads_get_4xx_and_write_nothing(small: tuple[str, Path]) -> None:
    url, path = small
    model = art.TrainableModel(name="strict", project="r", base_model="tiny")
    await model.register(art.RemoteBackend(url))
    groups = await _groups(model, n_groups=1)
    good = TrainRequest(model=ModelSpec.of(model), groups=groups, config=art.TrainConfig())
    body = json.loads(good.model_dump_json())
    json_ = {"content-type": "application/json", "idempotency-key": "cd" * 16}

    def post(content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.post(
            url + "/art/v1/train", content=content, headers={**json_, **(headers or {})}
        )

    cases: list[tuple[bytes, dict[str, str], int, str]] = [
        (b"{not json", {}, 400, "Invalid JSON"),
        (json.dumps({**body, "groups": "x"}).encode(), {}, 400, "groups"),
        (good.model_dump_json().encode(), {"idempotency-key": "../../etc"}, 400, "idempotency-key"),
        (json.dumps({**body, "request_id": "ab" * 16}).encode(), {}, 400, "request_id"),
        (
            json.dumps({**body, "model": {**body["model"], "name": "../up"}}).encode(),
            {},
            400,
            "name",
        ),
        (
            good.model_dump_json().replace('"reward":0.0', '"reward":NaN', 1).encode(),
            {},
            400,
            "reward",
        ),
        (
            json.dumps({**body, "model": {**body["model"], "name": "other"}}).encode(),
            {},
            404,
            "not registered",
        ),
        (b"\x1f\x8b garbage", {"content-encoding": "gzip"}, 400, "gzip"),
        (
            gzip.compress(b"[" * 300_000),
            {"content-encoding": "gzip"},
            413,
            "decompressed body is larger",
        ),
        (b" " * 70_000, {}, 413, "larger than 65536 bytes"),
        (good.model_dump_json().encode(), {"content-encoding": "br"}, 400, "Content-Encoding"),
    ]
    for content, headers, status, message in cases:
        r = post(content, headers)
        assert r.status_code == status, (message, r.text)
        assert message in r.json()["error"]["message"], (message, r.text)
    folder = path / "r" / "models" / "strict"
    assert not (folder / "trajectories").exists()
    assert not list(folder.glob("checkpoints/0*"))
    assert await model.get_step() == 0
    # The same server still trains a good upload.
    result = await model.train(groups, art.TrainConfig(learning_rate=2e-3))
    assert result.step == 1


def test_the_idempotency_key_is_the_same_for_the_same_call() -> None:
    """A retry re-encodes the body: gzip must give the same bytes (no timestamp), so the key
    derived from them is the same, and another starting step gives another key."""
    traj = art.Trajectory(messages=[{"role": "user", "content": "x" * 40_000}], reward=1.0)
    spec = ModelSpec(name="m", project="p", base_model="tiny", trainable=True)
    body = TrainRequest(model=spec, groups=[art.TrajectoryGroup([traj])], config=art.TrainConfig())
    (a, headers), (b, _) = encode_body(body), encode_body(body)
    assert headers.get("content-encoding") == "gzip" and a == b
    assert idempotency_key(spec, 3, a) == idempotency_key(spec, 3, b)
    assert idempotency_key(spec, 4, a) != idempotency_key(spec, 3, a)


def test_a_keyed_backend_checks_the_key_before_any_model_is_registered(tmp_path: Path) -> None:
    """Before the first model, `/v1` answers 503 but only to a client with the key: without
    it, 401, as after (the backend used to tell anyone that no model was registered yet)."""
    local = art.LocalBackend(tmp_path, server=art.ServerChoice(http=False))
    with start_app_server(create_backend_app(local, api_key=KEY)) as handle:
        url = f"http://127.0.0.1:{handle.port}"
        keyed = {"authorization": f"Bearer {KEY}"}
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/v1/models", headers=keyed).status_code == 503
        assert httpx.get(url + "/health").json() == {"status": "ok", "models": []}
    asyncio.run(local.close())
