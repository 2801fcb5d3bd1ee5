"""Late rewards: pending trajectories never train on a placeholder; waiting applies what
arrives and drops the rest after the timeout; a reward that comes after training is an
off-policy update only within max_staleness. `langfuse_fetcher` runs the real `langfuse`
SDK against the local receiver (tests/integrations/langfuse/receiver.py): scores and review
decisions become rewards, and a Langfuse that is down or failing never stops the wait."""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Iterator

import pytest

import art_langgraph as art
from art_langgraph.errors import NonFiniteRewardError
from art_langgraph.integrations.langfuse import LangfuseConfig, trace_id_for
from art_langgraph.late_rewards import is_pending, langfuse_fetcher
from art_langgraph.serving.runner import ServerHandle, start_app_server
from art_langgraph.training.prepare import prepare_step
from tests.integrations.langfuse.receiver import Receiver


def _group(tag: str, n: int = 3, *, pending: bool = True) -> art.TrajectoryGroup:
    trajs = []
    for i in range(n):
        call = art.LLMCall(prompt_token_ids=[1, 2], completion_token_ids=[3 + i])
        traj = art.Trajectory(id=f"{tag}{i}", calls=[call], reward=0.5)
        trajs.append(art.mark_pending(traj) if pending else traj)
    return art.TrajectoryGroup(trajs)


def test_a_pending_trajectory_is_refused_by_the_trainer() -> None:
    with pytest.raises(art.UsageError, match="wait for their reward"):
        prepare_step([_group("a")], art.TrainConfig(), 1)


async def test_what_arrives_is_applied_and_the_rest_dropped_after_the_timeout() -> None:
    calls: list[list[str]] = []

    def fetch(pending: list[art.Trajectory]) -> dict[str, float]:
        calls.append(sorted(t.id for t in pending))
        # a0 arrives at once, a1 on the second poll, a2 never; b0 only of group b
        return {"a0": 1.0, "b0": 0.0} if len(calls) == 1 else {"a1": 0.0}

    groups = [_group("a"), _group("b")]
    result = await art.wait_for_rewards(groups, fetch, timeout_s=0.05, poll_s=0.01)
    assert calls[0] == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert calls[1] == ["a1", "a2", "b1", "b2"]  # asked again only for what is missing
    assert result.arrived == 3 and result.missing == 3
    (a,) = result.groups  # b kept only b0: fewer than two, dropped
    assert [t.id for t in a] == ["a0", "a1"] and a.rewards() == [1.0, 0.0]
    assert result.dropped_groups == 1 and not any(is_pending(t) for t in a)
    assert all(is_pending(t) for g in groups for t in g)  # the inputs are untouched
    prepare_step(result.groups, art.TrainConfig(), 1)  # trainable now


async def test_train_without_keeps_the_fallback_reward() -> None:
    result = await art.wait_for_rewards(
        [_group("c")], lambda p: {"c0": 1.0}, timeout_s=0, on_timeout="train_without"
    )
    (c,) = result.groups
    assert c.rewards() == [1.0, 0.5, 0.5] and result.missing == 2


async def test_an_async_fetch_and_a_nan_reward() -> None:
    async def fetch(pending: list[art.Trajectory]) -> dict[str, float]:
        return {t.id: 1.0 for t in pending}

    result = await art.wait_for_rewards([_group("d")], fetch)
    assert result.arrived == 3 and result.waited_s < 5
    with pytest.raises(NonFiniteRewardError):
        await art.wait_for_rewards([_group("e")], lambda p: {"e0": math.nan})
    with pytest.raises(art.UsageError, match="on_timeout"):
        await art.wait_for_rewards([_group("f")], lambda p: {}, on_timeout="keep")  # type: ignore[arg-type]


def test_a_reward_after_training_is_off_policy_within_max_staleness_only() -> None:
    group = _group("g", pending=False)
    for i, t in enumerate(group):
        t.reward = float(i)
        t.calls[0].adapter_step = 1  # sampled by step 1's adapter
    fresh, m = prepare_step([group], art.TrainConfig(max_staleness=2), 3)
    assert fresh and m["stale_groups"] == 0
    _, m = prepare_step([group], art.TrainConfig(max_staleness=2), 5)
    assert m["stale_groups"] == 1


# ---------------------------------------------------------------- Langfuse as the source
@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, ServerHandle]]:
    rec = Receiver()
    handle = start_app_server(rec.app())
    yield rec, handle
    handle.stop()


def _config(port: int) -> LangfuseConfig:
    return LangfuseConfig(
        public_key="pk-test", secret_key="sk-test", base_url=f"http://127.0.0.1:{port}"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_langfuse_fetcher_reads_scores_and_review_decisions(
    receiver: tuple[Receiver, ServerHandle],
) -> None:
    rec, handle = receiver
    group = _group("r", n=5)
    t = list(group)
    rec.annotate(trace_id_for(t[0]), "review_score", 0.8)
    rec.annotate(trace_id_for(t[1]), "review_decision", "approve")
    rec.annotate(trace_id_for(t[2]), "review_decision", "reject")
    rec.annotate(trace_id_for(t[3]), "thumbs", "up")  # mapped only by value_map
    rec.annotate(trace_id_for(t[4]), "thumbs", "meh")  # mapped by nothing: not a reward
    rec.annotate(trace_id_for(t[4]), "review_score", 0.3, source="API")  # not ANNOTATION

    fetch = langfuse_fetcher(value_map={"up": 1.0}, config=_config(handle.port))
    result = await art.wait_for_rewards([group], fetch, timeout_s=0.2, poll_s=0.05)
    (g,) = result.groups
    assert [x.id for x in g] == ["r0", "r1", "r2", "r3"] and g.rewards() == [0.8, 1.0, 0.0, 1.0]
    assert result.arrived == 4 and result.missing == 1 and result.fetch_errors == 0


async def test_queue_reviews_arrive_once_their_item_is_completed(
    receiver: tuple[Receiver, ServerHandle],
) -> None:
    from art_langgraph.integrations.langfuse.annotation import send_to_review

    rec, handle = receiver
    group = _group("q", n=3)
    t = list(group)
    sent = send_to_review([group], queue="late", fraction=1.0, config=_config(handle.port))
    assert sent.queue_id is not None and sent.sent == 3
    qid = sent.queue_id
    rec.annotate(trace_id_for(t[0]), "review_score", 0.9, queue_id=qid, complete=True)
    rec.annotate(trace_id_for(t[1]), "review_score", 0.1, queue_id=qid)  # still in review
    rec.annotate(trace_id_for(t[2]), "review_decision", "reject", queue_id=qid, complete=True)

    fetch = langfuse_fetcher(queue_id=qid, config=_config(handle.port))
    result = await art.wait_for_rewards([group], fetch, timeout_s=0.2, poll_s=0.05)
    (g,) = result.groups
    assert [x.id for x in g] == ["q0", "q2"] and g.rewards() == [0.9, 0.0]
    assert result.missing == 1  # q1's review may still change: it is not a reward yet
    everything = langfuse_fetcher(queue_id=qid, config=_config(handle.port), completed_only=False)
    result = await art.wait_for_rewards([group], everything, timeout_s=0.2, poll_s=0.05)
    assert result.groups[0].rewards() == [0.9, 0.1, 0.0]


@pytest.mark.parametrize("failure", ["down", "500", "401"])
async def test_a_langfuse_down_or_failing_costs_a_warning_not_the_training(
    failure: str, receiver: tuple[Receiver, ServerHandle], caplog: pytest.LogCaptureFixture
) -> None:
    rec, handle = receiver
    port = _free_port() if failure == "down" else handle.port  # nobody listens on a free port
    cfg = _config(port)
    if failure == "500":
        rec.fail_with = 500
    if failure == "401":
        cfg = cfg.model_copy(update={"secret_key": "wrong"})
    fetch = langfuse_fetcher(name="review_score", config=cfg)

    with caplog.at_level(logging.WARNING, logger="art_langgraph.late_rewards"):
        dropped = await art.wait_for_rewards([_group("x")], fetch, timeout_s=0.3, poll_s=0.05)
        kept = await art.wait_for_rewards(
            [_group("y")], fetch, timeout_s=0.3, poll_s=0.05, on_timeout="train_without"
        )
    assert not dropped.groups and dropped.dropped_groups == 1 and dropped.missing == 3
    (y,) = kept.groups
    assert y.rewards() == [0.5, 0.5, 0.5] and not any(is_pending(x) for x in y)
    assert dropped.fetch_errors >= 1 and kept.fetch_errors >= 1
    warnings = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(warnings) == 2  # one per wait, however many polls failed
