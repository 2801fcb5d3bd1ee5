"""Review through Langfuse annotation queues, judge calibration, corrections as SFT examples.

Also the score configs' guarantees this loop leans on: every score sent references its
config (the receiver refuses one that does not), and a known reward range bounds the
reward configs.

The sample rule and the calibration numbers are checked on hand-made trajectories against
hand-computed values; queues, completed reviews, corrections and the fail-soft path run the
real `langfuse` SDK against the local receiver (`receiver.py`); the corrections
train a real SFT step on the tiny model.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest

import art_langgraph as art
from art_langgraph.cli import main as cli_main
from art_langgraph.integrations.langfuse import (
    LangfuseConfig,
    LangfuseLogger,
    export_folder,
    import_scores,
    trace_id_for,
)
from art_langgraph.integrations.langfuse.annotation import (
    REVIEW_FILE,
    ReviewQueueClashError,
    queue_id_for,
    review_sample,
    send_to_review,
)
from art_langgraph.integrations.langfuse.review import (
    CALIBRATION_FILE,
    SCORES_FILE,
    ReviewedScore,
    calibrate,
)
from art_langgraph.integrations.langfuse.scoring import (
    INDEPENDENT_REWARD,
    JUDGE_SPEARMAN,
    JUDGE_TOP_PICK_ACCURACY,
    REVIEW_DECISION,
    REVIEW_SCORE,
    REWARD,
    ScoreConfigClashError,
    ensure_score_configs,
    score_configs,
)
from art_langgraph.integrations.langfuse.sender import Sender
from art_langgraph.integrations.langfuse.sft import corrections_sft_file
from art_langgraph.rewards.calibration import judge_calibration
from art_langgraph.serving.runner import ServerHandle
from art_mcp.report import Report, summary_lines
from tests.integrations.langfuse.receiver import Receiver


def _config(handle: ServerHandle) -> LangfuseConfig:
    return LangfuseConfig(
        public_key="pk-test", secret_key="sk-test", base_url=f"http://127.0.0.1:{handle.port}"
    )


def _traj(name: str, reward: float, judge: float | None = None, own: float | None = None) -> Any:
    t = art.Trajectory(id=name, messages=[{"role": "user", "content": name}], reward=reward)
    if judge is not None:
        t.metrics["ruler_score"] = judge
    if own is not None:
        t.metrics["independent_reward"] = own
    return t


def _groups() -> list[art.TrajectoryGroup]:
    """Three groups: judged (with disagreements), plain rewards, and all-equal rewards."""
    return [
        art.TrajectoryGroup(
            [
                _traj("a0", 0.9, 0.9, 0.0),  # gap 0.9
                _traj("a1", 0.4, 0.4, 0.4),  # agree
                _traj("a2", 0.5, 0.5, 1.0),  # gap 0.5, nearest the median 0.45 (with a1)
                _traj("a3", 0.0, 0.0, 0.7),  # gap 0.7
            ]
        ),
        art.TrajectoryGroup([_traj("b0", 0.0), _traj("b1", 0.3), _traj("b2", 1.0)]),
        art.TrajectoryGroup([_traj("c0", 1.0), _traj("c1", 1.0)]),  # no borderline one
    ]


def _folder(tmp_path: Path, groups: list[art.TrajectoryGroup], step: int = 1) -> Path:
    folder = tmp_path / "proj" / "models" / "reviewed"
    (folder / "trajectories" / "train").mkdir(parents=True, exist_ok=True)
    art.write_jsonl(folder / f"trajectories/train/{step:04d}.jsonl", groups)
    return folder


def test_the_sample_takes_disagreements_borderline_ones_and_a_seeded_fraction() -> None:
    groups = _groups()
    only_gaps = review_sample(groups, fraction=0, disagreements=2, near_median=0)
    assert [(p.trajectory_id, p.reasons) for p in only_gaps] == [
        ("a0", ["disagreement"]),
        ("a3", ["disagreement"]),
    ]
    medians = review_sample(groups, fraction=0, disagreements=0, near_median=5)
    # a1 and a2 are both 0.05 from the median 0.45: the seeded hash picks one; b1 is the median
    assert {p.trajectory_id for p in medians} - {"a1", "a2"} == {"b1"} and len(medians) == 2
    assert all(p.reasons == ["median"] for p in medians)
    assert review_sample(groups, fraction=0, disagreements=0, near_median=1)[0].group in (0, 1)

    frac = review_sample(groups, fraction=0.25, disagreements=0, near_median=0, seed=3)
    assert len(frac) == 3  # ceil(0.25 * 9)
    shuffled = [
        art.TrajectoryGroup(random.Random(1).sample(g.trajectories, len(g))) for g in groups
    ]
    again = review_sample(shuffled[::-1], fraction=0.25, disagreements=0, near_median=0, seed=3)
    assert {p.trajectory_id for p in again} == {p.trajectory_id for p in frac}  # any order
    seeds = {
        frozenset(p.trajectory_id for p in review_sample(groups, fraction=0.25, seed=s))
        for s in range(6)
    }
    assert len(seeds) > 1  # the seed changes the fraction's picks

    everything = review_sample(groups, fraction=1.0, disagreements=3, near_median=3)
    assert len(everything) == 9  # deduplicated
    a0 = next(p for p in everything if p.trajectory_id == "a0")
    assert a0.reasons == ["disagreement", "fraction"] and a0.trace_id == trace_id_for(
        groups[0].trajectories[0]
    )
    with pytest.raises(art.UsageError, match="fraction"):
        review_sample(groups, fraction=1.5)


def test_calibration_matches_hand_computed_spearman_and_top_pick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    groups = [
        art.TrajectoryGroup(
            [_traj("x0", 0, 0.9), _traj("x1", 0, 0.5), _traj("x2", 0, 0.1), _traj("x3", 0, 0.3)]
        ),
        art.TrajectoryGroup([_traj("y0", 0, 0.2), _traj("y1", 0, 0.8)]),
    ]
    human = {"x0": 1.0, "x1": 0.0, "x2": 0.5, "y0": 0.0, "y1": 1.0, "z": 1.0}  # x3 unreviewed
    cal = judge_calibration(groups, human)
    # judge ranks [5, 3, 1, 2, 4]; human ranks [4.5, 1.5, 3, 1.5, 4.5] (ties averaged):
    # sum dxdy = 6, sum dx^2 = 10, sum dy^2 = 9 -> rho = 6 / sqrt(90)
    assert cal.pairs == 5 and cal.spearman == pytest.approx(6 / 90**0.5)
    assert (cal.groups, cal.top_pick_hits, cal.top_pick_accuracy) == (2, 2, 1.0)
    assert cal.top_pick_chance == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert cal.warning is None

    # the judge ranks against the humans: a warning, logged and in the record and report
    flipped = {k: 1.0 - v for k, v in human.items()}
    with caplog.at_level(logging.WARNING):
        low = judge_calibration(groups, flipped)
    assert low.spearman == pytest.approx(-6 / 90**0.5) and low.top_pick_hits == 0
    assert low.warning and "below 0.5" in low.warning
    assert any("agrees poorly" in r.getMessage() for r in caplog.records)
    from art_mcp.evaluation import Evaluation

    report = Report(
        model="m",
        server="s",
        steps=1,
        judge_calibration=low,
        evaluations=[Evaluation(step=0, rl_step=0, greedy={"s": 0.0})],
    )
    lines = summary_lines(report)
    assert any(line.startswith("- WARNING: the RULER judge agrees poorly") for line in lines)
    assert any("Spearman -0.63 over 5 traces" in line for line in lines)
    # too few pairs to warn about
    assert judge_calibration(groups[1:], flipped).warning is None


def test_a_queue_is_made_once_gets_each_pick_once_and_a_clash_is_refused(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path
) -> None:
    rec, handle = receiver
    config = _config(handle)
    groups = _groups()
    folder = _folder(tmp_path, groups)
    first = send_to_review(groups, queue="rl-review", fraction=0.25, folder=folder, config=config)
    assert first.sent == len(first.picks) >= 4 and first.unsent == 0
    assert len(rec.queues) == 1
    queue = next(iter(rec.queues.values()))
    names = {rec.score_configs[c]["name"] for c in queue["scoreConfigIds"]}
    assert queue["name"] == "rl-review" and names == {REVIEW_DECISION, REVIEW_SCORE}
    items = list(rec.queue_items.values())
    assert sorted(i["objectId"] for i in items) == sorted(p.trace_id for p in first.picks)
    assert {(i["objectType"], i["status"]) for i in items} == {("TRACE", "PENDING")}

    again = send_to_review(groups, queue="rl-review", fraction=0.5, folder=folder, config=config)
    # the larger fraction's picks include the smaller's (same seed): those are not re-added
    assert len(rec.queues) == 1 and again.already == len(first.picks)
    assert again.sent == len(again.picks) - len(first.picks) > 0
    assert len(rec.queue_items) == len(again.picks)
    assert queue_id_for("rl-review", config=config) == queue["id"]

    # the CLI over the saved trajectories: nothing new for the same sample
    env = {"LANGFUSE_PUBLIC_KEY": "pk-test", "LANGFUSE_SECRET_KEY": "sk-test"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**env, "LANGFUSE_BASE_URL": config.base_url or ""}.items():
            mp.setenv(k, v)
        assert cli_main(["langfuse", "review", str(folder), "--queue", "rl-review"]) == 0
    assert len(rec.queue_items) == len(again.picks)

    # a queue of that name tied to other score configs: a clear error, nothing added
    sender = Sender(config.resolved())
    other = sender.api.score_configs.create(name="helpfulness", data_type="NUMERIC")
    sender.api.annotation_queues.create_queue(name="taken", score_config_ids=[other.id])
    sender.close()
    n = len(rec.queue_items)
    with pytest.raises(ReviewQueueClashError, match=r"'taken'.*pick another queue name"):
        send_to_review(groups, queue="taken", config=config)
    assert len(rec.queue_items) == n


def test_completed_queue_reviews_become_rewards_and_calibrate_the_judge(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path
) -> None:
    rec, handle = receiver
    config = _config(handle)
    groups = [
        art.TrajectoryGroup(
            [_traj(f"p{i}", j, j, 0.0) for i, j in enumerate((0.9, 0.6, 0.3, 0.1, 0.0))]
        ),
        art.TrajectoryGroup([_traj(f"q{i}", j, j, 0.0) for i, j in enumerate((0.2, 0.8))]),
    ]
    folder = _folder(tmp_path, groups)
    report = send_to_review(groups, queue="rl-review", fraction=1.0, folder=folder, config=config)
    qid = report.queue_id
    assert qid is not None and report.sent == 7
    ids = {t.id: trace_id_for(t) for g in groups for t in g}
    # reviewers work through the queue: a grade, a verdict, or both (the grade wins)
    human = {"p0": 1.0, "p1": 0.75, "p2": 0.5, "p3": 0.0, "q0": 0.0, "q1": 1.0}
    for tid, value in human.items():
        if tid in ("p0", "p3"):
            rec.annotate(ids[tid], REVIEW_DECISION, "approve" if value else "reject", queue_id=qid)
        else:
            rec.annotate(ids[tid], REVIEW_SCORE, value, queue_id=qid)
    rec.annotate(ids["p1"], REVIEW_DECISION, "reject", queue_id=qid)  # overruled by its grade
    rec.correct(ids["p2"], "a better answer", queue_id=qid)  # not a reward
    rec.annotate(ids["p4"], REVIEW_SCORE, 0.25, queue_id=qid)  # still being reviewed
    sender = Sender(config.resolved())
    for item in rec.queue_items.values():  # "Complete + next" on every item but p4
        if item["objectId"] != ids["p4"]:
            done = sender.api.annotation_queues.update_queue_item(
                qid, item["id"], status="COMPLETED"
            )
            assert done.status == "COMPLETED" and done.completed_at is not None
    sender.close()

    res = import_scores(folder, queue_id=qid, config=config)
    rewards = {t.id: t.reward for g in res.groups for t in g}
    assert rewards == human and res.applied == 6 and res.dropped == 1  # p4 not completed
    assert res.in_progress == 1 and not res.unusable and not res.unmatched
    every = import_scores(folder, queue_id=qid, config=config, completed_only=False)
    assert {t.id: t.reward for g in every.groups for t in g} == human | {"p4": 0.25}
    with pytest.raises(art.UsageError, match="no annotation queue with id 'no-such-queue'"):
        import_scores(folder, queue_id="no-such-queue", config=config)
    assert res.groups[0].trajectories[1].metadata["review"]["name"] == REVIEW_SCORE

    # the judge against the reviews: judge = the old reward; by hand, rho over 6 pairs
    cal = calibrate(folder, queue="rl-review", dataset_run_id="run-7", config=config)
    j = [0.9, 0.6, 0.3, 0.1, 0.2, 0.8]
    h = [1.0, 0.75, 0.5, 0.0, 0.0, 1.0]
    assert cal.pairs == 6 and cal.spearman == pytest.approx(_rho(j, h))
    assert (cal.groups, cal.top_pick_hits) == (2, 2) and cal.warning is None
    assert (folder / CALIBRATION_FILE).exists()
    run_scores = {s["name"]: s for s in rec.scores.values() if s.get("datasetRunId") == "run-7"}
    assert run_scores["judge_spearman"]["value"] == pytest.approx(cal.spearman)
    assert run_scores["judge_top_pick_accuracy"]["value"] == 1.0
    configs = {c["id"]: c for c in rec.score_configs.values()}
    for name, score in run_scores.items():  # each references its numeric, bounded config
        c = configs[score["configId"]]
        assert c["name"] == name and c["dataType"] == "NUMERIC"
    assert (configs[run_scores[JUDGE_SPEARMAN]["configId"]]["minValue"], 1) == (-1, 1)
    assert configs[run_scores[JUDGE_TOP_PICK_ACCURACY]["configId"]]["maxValue"] == 1


def _rho(x: list[float], y: list[float]) -> float:
    """Spearman by the textbook: Pearson of average ranks (written out again, not imported)."""

    def ranks(v: list[float]) -> list[float]:
        return [sum(w < a for w in v) + (sum(w == a for w in v) + 1) / 2 for a in v]

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den


def test_langfuse_down_records_the_picks_and_export_sends_them_later(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rec, handle = receiver
    config = _config(handle)
    groups = _groups()
    folder = _folder(tmp_path, groups)
    rec.fail_with = 503
    with caplog.at_level(logging.WARNING):
        down = send_to_review(groups, queue="later", fraction=0.25, folder=folder, config=config)
        gone = _config(handle).model_copy(update={"base_url": "http://127.0.0.1:9"})
        refused = send_to_review(groups, queue="later", fraction=0.5, folder=folder, config=gone)
    assert down.unsent == len(down.picks) > 0 and down.sent == 0 and down.error
    assert refused.unsent == len(refused.picks) and refused.error
    assert len([r for r in caplog.records if "not sent" in r.getMessage()]) == 1  # once
    assert not rec.queues and (folder / REVIEW_FILE).exists()

    rec.fail_with = None
    report = export_folder(folder, config=config)
    assert not report.failed_batches and report.review_items == len(refused.picks)
    assert report.review_unsent == 0 and len(rec.queue_items) == len(refused.picks)
    assert export_folder(folder, config=config).review_items == 0  # sent once


@pytest.mark.parametrize("failure", [503, 400, "down"])
def test_calibration_scores_survive_a_failing_langfuse_and_export_sends_them(
    receiver: tuple[Receiver, ServerHandle],
    tmp_path: Path,
    failure: int | str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec, handle = receiver
    groups = [art.TrajectoryGroup([_traj("p0", 0.9, 0.9), _traj("p1", 0.2, 0.2)])]
    folder = _folder(tmp_path, groups)
    reviews = [  # given, as read before Langfuse went away
        ReviewedScore(
            id=f"r{i}", trace_id=trace_id_for(t), name=REVIEW_SCORE, value=v, source="ANNOTATION"
        )
        for i, (t, v) in enumerate(zip(groups[0], (1.0, 0.0), strict=True))
    ]
    config = _config(handle)
    if failure == "down":
        config = config.model_copy(update={"base_url": "http://127.0.0.1:9"})  # nothing listens
    else:
        rec.fail_with = int(failure)
    with caplog.at_level(logging.WARNING):
        cal = calibrate(folder, queue="q", dataset_run_id="run-1", config=config, scores=reviews)
    assert cal.top_pick_accuracy == 1.0 and (folder / CALIBRATION_FILE).exists()
    assert "not sent" in caplog.text and "art-langgraph langfuse export" in caplog.text
    assert not rec.scores
    recorded = [json.loads(x) for x in (folder / SCORES_FILE).read_text().splitlines()]
    assert {(r["status"], r["score"]["name"]) for r in recorded} == {
        ("unsent", JUDGE_SPEARMAN),
        ("unsent", JUDGE_TOP_PICK_ACCURACY),
    }

    rec.fail_with = None
    report = export_folder(folder, config=_config(handle))
    assert (report.run_scores, report.run_scores_unsent) == (2, 0)
    sent = {s["name"]: s for s in rec.scores.values() if s.get("datasetRunId") == "run-1"}
    assert sent[JUDGE_TOP_PICK_ACCURACY]["value"] == 1.0 and set(sent) == {
        JUDGE_SPEARMAN,
        JUDGE_TOP_PICK_ACCURACY,
    }
    names = {c["id"]: c["name"] for c in rec.score_configs.values()}
    assert all(names[s["configId"]] == n for n, s in sent.items())
    assert export_folder(folder, config=_config(handle)).run_scores == 0  # sent once


def test_the_receiver_refuses_a_score_that_does_not_reference_its_config(
    receiver: tuple[Receiver, ServerHandle],
) -> None:
    rec, handle = receiver
    sender = Sender(_config(handle).resolved())
    try:
        ids = sender.config_ids()
        body = {"id": "x", "traceId": "ab" * 16, "name": REWARD, "value": 0.5}
        with pytest.raises(RuntimeError, match=r"rejected 1 scores.*no configId"):
            sender.send_scores([body])
        sender.send_scores([{**body, "configId": ids[REWARD]}])
        sender.send_scores([{**body, "id": "y", "name": "helpfulness"}])  # no config: taken
    finally:
        sender.close()
    assert set(rec.scores) == {"x", "y"}


def test_a_known_reward_range_bounds_the_reward_configs(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path
) -> None:
    rec, handle = receiver
    config = _config(handle).model_copy(update={"reward_range": (-1.0, 2.0)})
    groups = [art.TrajectoryGroup([_traj("a", -0.5, own=-0.5), _traj("b", 2.0, own=2.0)])]
    folder = _folder(tmp_path, groups)
    report = export_folder(folder, config=config)
    assert report.batches == 1 and report.scores == 4 and not report.failed_batches
    by_name = {c["name"]: c for c in rec.score_configs.values()}
    for name in (REWARD, INDEPENDENT_REWARD):
        assert (by_name[name]["minValue"], by_name[name]["maxValue"]) == (-1, 2)
        assert "[-1, 2]" in by_name[name]["description"]
    # a reward outside the range: Langfuse rejects it, the batch is recorded as not sent
    art.write_jsonl(
        folder / "trajectories/train/0002.jsonl", [art.TrajectoryGroup([_traj("c", 3.0)])]
    )
    late = export_folder(folder, config=config)
    assert late.failed_batches == [("train", 2)] and late.batches == 0
    # a review queue ties itself to the review configs only: the bounded reward is no clash
    assert send_to_review(groups, queue="bounded", fraction=1.0, config=config).sent == 2

    sender = Sender(config.resolved())
    api = sender.api
    try:
        # the same range, or a narrower one, reuses the config; a wider one is a clear clash
        assert ensure_score_configs(api, score_configs((0.0, 1.0)))[REWARD] == by_name[REWARD]["id"]
        with pytest.raises(ScoreConfigClashError, match=r"range \[-1.0, 2.0\].*\[-5.0, 2.0\]"):
            ensure_score_configs(api, score_configs((-5.0, 2.0)))
        with pytest.raises(ScoreConfigClashError, match="does not contain"):
            ensure_score_configs(api)  # unknown range: unbounded, which [-1, 2] does not contain
    finally:
        sender.close()
    for bad in [(1.0, 0.0), (0.0, float("inf"))]:
        with pytest.raises(ValueError, match="reward_range must be"):
            LangfuseConfig(reward_range=bad)


async def test_corrections_become_sft_examples_that_train(
    fresh_model: art.TrainableModel,
    lg_backend: art.LocalBackend,
    receiver: tuple[Receiver, ServerHandle],
    tmp_path: Path,
) -> None:
    rec, handle = receiver
    model = fresh_model
    client = model.openai_client(max_retries=0)

    async def two_calls(i: int) -> art.Trajectory:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Count to {i}"}]
        calls = []
        for _ in range(2):
            kw: dict[str, Any] = {
                "model": model.inference_name(),
                "messages": list(messages),
                "max_tokens": 6,
                "logprobs": True,
                "extra_body": {"return_token_ids": True},
            }
            call = art.LLMCall.from_openai(kw, await client.chat.completions.create(**kw))
            calls.append(call)
            messages += [call.response_message, {"role": "user", "content": "and again"}]
        return art.Trajectory(messages=messages[:-1], calls=calls, reward=0.0)

    trajs = [await two_calls(i) for i in range(3)]
    logger = LangfuseLogger(_config(handle))
    lg_backend.loggers.loggers.append(logger)
    try:
        await model.log([art.TrajectoryGroup(trajs)], split="train")
    finally:
        lg_backend.loggers.loggers.remove(logger)
        logger.close()
    folder = lg_backend.path / model.project / "models" / model.name
    ids = [trace_id_for(t) for t in trajs]
    gens = [o for o in rec.trace_observations(ids[0]) if o["type"] == "GENERATION"]
    first_gen = [o for o in gens if o["input"] == trajs[0].calls[0].messages]
    assert len(gens) == 2 and len(first_gen) == 1
    # the reviewer rewrites the first reply of trace 0 (as the JSON message Langfuse showed),
    # and the final output of trace 1 (a trace-level correction, plain text)
    rec.correct(
        ids[0], '{"role": "assistant", "content": "one"}', observation_id=first_gen[0]["id"]
    )
    rec.correct(ids[1], "one two three")
    rec.correct("f" * 32, "not ours")

    out = tmp_path / "corrections.jsonl"
    assert corrections_sft_file(folder, out, config=_config(handle)) == 2
    examples = art.read_jsonl(out)
    by_source = {e.metadata["corrected_trajectory_id"]: e for e in examples}
    e0, e1 = by_source[trajs[0].id], by_source[trajs[1].id]
    assert e0.messages == [trajs[0].messages[0], {"role": "assistant", "content": "one"}]
    assert [c.trainable for c in e0.calls] == [True] and e0.metadata["corrected_call"] == 0
    assert e1.metadata["corrected_call"] == 1 and [c.trainable for c in e1.calls] == [False, True]
    assert e1.messages[:-1] == trajs[1].calls[1].messages  # the trajectory up to that call
    assert e1.messages[-1] == {"role": "assistant", "content": "one two three"}
    assert e1.calls[0].prompt_token_ids == trajs[1].calls[0].prompt_token_ids  # context kept
    # the import path leaves corrections out of the rewards, and train_sft takes the file
    assert not import_scores(folder, config=_config(handle)).unusable
    step = await model.get_step()
    sft = await model.train_sft(examples, epochs=1, batch_size=2)
    assert sft.step == step + 1 and sft.metrics["sft_steps"] == 1


def test_art_mcp_train_takes_the_review_flags() -> None:
    from art_mcp.cli import _parser
    from art_mcp.config import HarnessConfig

    args = _parser().parse_args(
        ["train", "--server", "x", "--review-queue", "rl-review", "--review-fraction", "0.2"]
    )
    cfg = HarnessConfig(**{k: getattr(args, k) for k in HarnessConfig.model_fields})
    assert (cfg.review_queue, cfg.review_fraction) == ("rl-review", 0.2)
    assert HarnessConfig().review_queue is None


@pytest.mark.slow
async def test_an_art_mcp_run_sends_rollouts_to_review_and_reports_the_judge(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_mcp import HarnessConfig, train

    rec, handle = receiver
    for k, v in {
        "LANGFUSE_PUBLIC_KEY": "pk-test",
        "LANGFUSE_SECRET_KEY": "sk-test",
        "LANGFUSE_BASE_URL": f"http://127.0.0.1:{handle.port}",
    }.items():
        monkeypatch.setenv(k, v)
    root = Path(__file__).resolve().parents[3]
    cfg = HarnessConfig(
        path=str(tmp_path),
        base_model="tiny",
        steps=1,
        group_size=2,
        groups_per_step=3,
        sft_epochs=0,
        max_tokens=24,
        max_turns=2,
        tool_choice="required",
        eval_scenarios=1,
        eval_samples=0,
        val_fraction=0.1,
        judge="local",
        review_queue="mcp-review",
        review_fraction=1.0,
    )

    async def run() -> Any:
        return await train(
            "python -m examples.mcp_server.server",
            cfg,
            scenarios=root / "examples/mcp_server/scenarios.jsonl",
            reward="examples.mcp_server.tasks:score",
            log=lambda _: None,
        )

    report = await run()
    folder = Path(report.folder)
    trained = [
        t
        for f in (folder / "trajectories/train").glob("*.jsonl")
        for g in art.read_groups(f)
        for t in g
    ]
    assert len(trained) == 6
    (queue,) = rec.queues.values()
    assert queue["name"] == "mcp-review"
    assert {i["objectId"] for i in rec.queue_items.values()} == {trace_id_for(t) for t in trained}
    assert (folder / CALIBRATION_FILE).exists() and report.judge_calibration is not None
    assert report.judge_calibration.pairs == 0  # nobody has reviewed yet

    # reviewers grade every rollout against the judge; the same command again reports it
    for t in trained:
        grade = 1.0 - float(t.metrics["ruler_score"])
        rec.annotate(trace_id_for(t), REVIEW_SCORE, grade, queue_id=queue["id"], complete=True)
    again = await run()
    cal = again.judge_calibration
    assert cal is not None and cal.pairs == 6
    text = (folder / "report.md").read_text()
    assert "judge vs human review:" in text and "over 6 traces" in text
    assert (cal.warning is not None) == (cal.spearman is not None)  # -1 when the judge varies
    assert (cal.warning is not None) == ("WARNING: the RULER judge agrees poorly" in text)
    # and as scores of the last evaluation's dataset run
    run_scores = {s["name"] for s in rec.scores.values() if s.get("datasetRunId")}
    numbers = {"judge_spearman": cal.spearman, "judge_top_pick_accuracy": cal.top_pick_accuracy}
    assert {n for n, v in numbers.items() if v is not None} <= run_scores
