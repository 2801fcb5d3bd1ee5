"""The Langfuse reward source of `late_rewards`: `langfuse_fetcher` against the local
receiver of Langfuse's public API (scores, review decisions, queue items completed or
not), and a Langfuse that is down or erring, which costs a warning, not the training."""

from __future__ import annotations

import logging
import socket

import pytest

import art_langgraph as art
from art_langgraph.integrations.langfuse import LangfuseConfig, langfuse_fetcher, trace_id_for
from art_langgraph.serving.runner import ServerHandle
from art_langgraph.trajectories.late_rewards import is_pending
from tests.integrations.langfuse.receiver import Receiver
from tests.trajectories.test_late_rewards import _group


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

    with caplog.at_level(logging.WARNING, logger="art_langgraph.trajectories.late_rewards"):
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
