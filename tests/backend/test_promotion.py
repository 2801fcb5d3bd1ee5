"""Promotion gated on evaluation: the bare name serves the promoted step, rollouts the latest.

Real engine, real server on a free loopback port, the real `openai` client as the app;
steps are made cheaply with a one-batch `train_sft`. Covered: the default (bare name =
latest), opt-in (bare name = promoted, `chat_model()`/`openai_client()` = latest), the
tolerance, `art-langgraph promote`/`rollback` on a live server (in process and as a
subprocess), clear errors, RemoteBackend, and decisions surviving a backend restart.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI

import art_langgraph as art
from art_langgraph import cli
from art_langgraph.backend.api.server import create_backend_app
from art_langgraph.backend.promotion import PromotionDecision, decide
from art_langgraph.runtime.http_pool import async_http_client
from art_langgraph.serving.runner import start_app_server

ROOT = Path(__file__).resolve().parents[2]
SFT = [[{"role": "user", "content": "count"}, {"role": "assistant", "content": "one two"}]]
LR = art.TrainConfig(learning_rate=1e-3)


@pytest.fixture(scope="module")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[art.LocalBackend]:
    async with art.LocalBackend(path=tmp_path_factory.mktemp("promo")) as b:
        yield b


async def _model(backend: object, name: str, **config: object) -> art.TrainableModel:
    model = art.TrainableModel(
        name=name, project="p", base_model="tiny", training=art.ModelConfig(**config)
    )
    await model.register(backend)  # type: ignore[arg-type]
    return model


async def _step(model: art.TrainableModel) -> int:
    return (await model.train_sft(SFT, LR, epochs=1, batch_size=1)).step


def _app(model: art.Model) -> AsyncOpenAI:
    """The app's own client: any OpenAI client naming the bare name."""
    return AsyncOpenAI(
        base_url=model.inference_base_url,
        api_key=model.inference_api_key or "local",
        max_retries=0,
        http_client=async_http_client(),
    )


async def _served(model: art.Model, name: str | None = None) -> str:
    """Which `name@step` answered a request for `name` (default: the bare name)."""
    r = await _app(model).chat.completions.create(
        model=name or model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return r.model


def _lines(folder: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (folder / "promotion.jsonl").read_text().splitlines()]


async def test_default_serves_the_latest_step(backend: art.LocalBackend) -> None:
    model = await _model(backend, "plain")
    assert await _step(model) == 1
    assert await _served(model) == "plain@1"
    assert model.inference_name() == "plain"  # the request string is unchanged
    rollout = await model.chat_model(max_tokens=2).ainvoke("hi")
    assert rollout.response_metadata["model_name"] == "plain@1"
    assert not (backend.path / "p" / "models" / "plain" / "promotion.jsonl").exists()
    with pytest.raises(art.UsageError, match="promotion is off for model 'plain'"):
        await model.record_evaluation(1, 0.5)


async def test_opt_in_serves_the_promoted_step_and_rollouts_the_latest(
    backend: art.LocalBackend,
) -> None:
    model = await _model(backend, "gated", promote_on_evaluation=True)
    folder = backend.path / "p" / "models" / "gated"
    assert [d["action"] for d in _lines(folder)] == ["start"]  # step 0 promoted on turning it on
    assert await _step(model) == 1
    assert await _served(model) == "gated@0"  # not evaluated: the app keeps step 0
    assert await _served(model, "gated@latest") == "gated@1"
    assert await _served(model, "gated@1") == "gated@1"
    # the training rollouts' clients ask for the latest step
    msg = await model.chat_model(max_tokens=2).ainvoke("hi")
    assert msg.response_metadata["model_name"] == "gated@1"
    client = model.openai_client(max_retries=0)
    r = await client.chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert r.model == "gated@1" and model.inference_name() == "gated@latest"

    d0 = await model.record_evaluation(0, 0.5)
    assert d0.promoted and d0.served == 0 and d0.score == 0.5
    d1 = await model.record_evaluation(1, 0.49)  # within the default tolerance (0.02)
    assert d1.promoted and d1.served == 1 and "0.49 >= 0.48" in d1.reason
    assert await _served(model) == "gated@1"
    assert await _step(model) == 2
    d2 = await model.record_evaluation(2, 0.4)  # below 0.49 - 0.02
    assert not d2.promoted and d2.served == 1 and "step 1 stays promoted" in d2.reason
    assert await _served(model) == "gated@1"
    assert (await model.chat_model(max_tokens=2).ainvoke("hi")).response_metadata[
        "model_name"
    ] == "gated@2"
    # every response names the step that answered: streamed, and through the Responses API
    stream = await _app(model).chat.completions.create(
        model="gated", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
    )
    assert {chunk.model async for chunk in stream} == {"gated@1"}
    resp = await _app(model).responses.create(model="gated", input="hi", max_output_tokens=2)
    assert resp.model == "gated@1"

    with pytest.raises(art.UsageError, match=r"no checkpoint for step 7 \(steps: 0, 1, 2\)"):
        await model.record_evaluation(7, 1.0)
    with pytest.raises(art.UsageError, match="finite number"):
        await model.record_evaluation(2, float("nan"))
    lines = _lines(folder)
    assert [(d["action"], d["step"], d["promoted"], d["served"]) for d in lines] == [
        ("start", 0, True, 0),
        ("evaluation", 0, True, 0),
        ("evaluation", 1, True, 1),
        ("evaluation", 2, False, 1),
    ]
    assert all(isinstance(d["time"], float) and d["reason"] for d in lines)
    # the promoted step outlives delete_checkpoints
    assert await model.delete_checkpoints(keep_last=1) == []
    assert (folder / "checkpoints" / "0001").is_dir()


async def test_promote_and_rollback_commands_act_on_a_live_server(
    backend: art.LocalBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    model = await _model(backend, "cli", promote_on_evaluation=True)
    for _ in range(2):
        await _step(model)
    path = ["--path", str(backend.path)]
    assert cli.main(["promote", "cli", "1", *path]) == 0
    assert "cli: serving step 1" in capsys.readouterr().out
    assert await _served(model) == "cli@1"
    # the real command, in another process, as a user runs it
    done = subprocess.run(
        [sys.executable, "-m", "art_langgraph.cli", "promote", "cli", "2", *path, "--project", "p"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert await _served(model) == "cli@2"
    assert cli.main(["rollback", "cli", *path]) == 0
    assert await _served(model) == "cli@1"
    folder = backend.path / "p" / "models" / "cli"
    assert cli.main(["rollback", str(folder)]) == 0  # a folder works as well as a name
    assert await _served(model) == "cli@0"
    capsys.readouterr()

    assert cli.main(["rollback", "cli", *path]) == 2
    assert "nothing to roll back to in cli: step 0 is promoted" in capsys.readouterr().err
    assert cli.main(["promote", "cli", "9", *path]) == 2
    assert "no checkpoint for step 9 (steps: 0, 1, 2)" in capsys.readouterr().err
    assert cli.main(["promote", "nope", "1", *path]) == 2
    err = capsys.readouterr().err
    assert "no model 'nope'" in err and "p/cli" in err
    assert await _served(model) == "cli@0"  # the errors changed nothing
    # an evaluation after a rollback compares with the step served now
    d = await model.record_evaluation(2, 0.3)
    assert d.promoted and "no score to compare" in d.reason
    assert await _served(model) == "cli@2"


async def test_decisions_survive_a_backend_restart(tmp_path: Path) -> None:
    async with art.LocalBackend(path=tmp_path) as first:
        model = await _model(first, "keep", promote_on_evaluation=True)
        await _step(model)
        await _step(model)
        await model.record_evaluation(1, 0.8)
        assert (await model.record_evaluation(2, 0.1)).served == 1
        assert await _served(model) == "keep@1"
    async with art.LocalBackend(path=tmp_path) as second:
        model = await _model(second, "keep", promote_on_evaluation=True)
        assert await model.get_step() == 2
        assert await _served(model) == "keep@1"
        assert (await model.chat_model(max_tokens=2).ainvoke("hi")).response_metadata[
            "model_name"
        ] == "keep@2"
        assert [d["action"] for d in _lines(tmp_path / "p" / "models" / "keep")] == [
            "start",
            "evaluation",
            "evaluation",
        ]  # no second "start": the history is read, not restarted
        # the comparison uses the score recorded before the restart
        assert not (await model.record_evaluation(2, 0.7)).promoted  # 0.7 < 0.8 - 0.02
        assert (await model.record_evaluation(2, 0.79)).promoted
        assert await _served(model) == "keep@2"


async def test_record_evaluation_through_remote_backend(tmp_path: Path) -> None:
    local = art.LocalBackend(path=tmp_path, server=art.ServerChoice(http=False))
    handle = start_app_server(create_backend_app(local), host="127.0.0.1", port=0)
    try:
        url = handle.base_url.removesuffix("/v1")
        model = await _model(art.RemoteBackend(url), "far", promote_on_evaluation=True)
        await _step(model)
        decision = await model.record_evaluation(1, 0.2)
        assert isinstance(decision, PromotionDecision)
        assert decision.promoted and decision.served == 1
        assert await _served(model) == "far@1"
        with pytest.raises(art.UsageError, match="no checkpoint for step 5"):
            await model.record_evaluation(5, 0.2)
    finally:
        await asyncio.to_thread(handle.stop)
        await local.close()


def _d(
    action: str, step: int, score: float | None, promoted: bool, served: int
) -> PromotionDecision:
    return PromotionDecision(
        action=action,  # type: ignore[arg-type]
        step=step,
        score=score,
        promoted=promoted,
        served=served,
        reason="",
        time=0.0,
    )


def test_decide_rules() -> None:
    start = [_d("start", 3, None, True, 3)]
    assert decide(start, 4, 0.1, 0.02).promoted  # the promoted step was never scored
    scored = [*start, _d("evaluation", 3, 0.5, True, 3)]
    assert decide(scored, 4, 0.48, 0.02).promoted  # exactly at the bar
    assert not decide(scored, 4, 0.47, 0.02).promoted
    assert decide(scored, 4, 0.47, 0.05).promoted
    older = decide(scored, 2, 0.9, 0.02)
    assert not older.promoted and older.served == 3 and "older" in older.reason
    again = decide(scored, 3, 0.1, 0.02)  # the promoted step re-evaluated: stays, new score
    assert again.promoted and again.score == 0.1
    rolled = [*scored, _d("promote", 5, None, True, 5), _d("rollback", 3, 0.5, True, 3)]
    assert decide(rolled, 6, 0.49, 0.0).served == 3  # compared with step 3's 0.5
