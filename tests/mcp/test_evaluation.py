"""Held-out evaluation records: success, format, the paired rise, changed examples."""

from __future__ import annotations

import math

import pytest

import art_langgraph as art
from art_mcp.evaluation import (
    Evaluation,
    changed_examples,
    entity_clusters,
    episode_format,
    paired_rise,
    transcript,
)
from art_mcp.scenarios import Scenario
from art_mcp.scoring import shuffle_rewards


def _ev(greedy: dict[str, float], sampled: dict[str, list[float]], step: int = 0) -> Evaluation:
    return Evaluation(step=step, rl_step=step, greedy=greedy, sampled=sampled)


def test_success_counts_only_solved_episodes() -> None:
    ev = _ev({"a": 1.0, "b": 0.2}, {"a": [1.0, 0.0, 1.0, 1.0], "b": [0.2, 0.2, 0.0, 1.0]})
    assert ev.greedy_success == 0.5 and ev.greedy_reward == pytest.approx(0.6)
    assert ev.sampled_success == pytest.approx((0.75 + 0.25) / 2)
    assert ev.per_scenario_success("sampled") == {"a": 0.75, "b": 0.25}


def test_an_evaluation_survives_report_json() -> None:
    """A resumed run loads its evaluations back, with samples or without."""
    for ev in (_ev({"a": 1.0}, {}), _ev({"a": 0.2}, {"a": [1.0, 0.0]})):
        ev.sampled_format = 0.5 if ev.sampled else None
        back = Evaluation.model_validate_json(ev.model_dump_json())
        assert back == ev and back.summary().keys() == ev.summary().keys()


def test_paired_rise_pairs_by_scenario() -> None:
    before = _ev(
        {"a": 0.0, "b": 0.0, "c": 1.0}, {"a": [0.0, 0.0], "b": [0.0, 1.0], "c": [1.0, 1.0]}
    )
    after = _ev(
        {"a": 1.0, "b": 0.0, "d": 1.0}, {"a": [1.0, 1.0], "b": [1.0, 1.0], "c": [1.0, 0.0]}, 2
    )
    greedy = paired_rise(before, after, "greedy")
    assert greedy["n"] == 2 and greedy["rise"] == 0.5  # a: 0 -> 1, b: 0 -> 0; c, d unpaired
    sampled = paired_rise(before, after, "sampled")
    diffs = [1.0, 0.5, -0.5]
    mean = sum(diffs) / 3
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2 / 3)
    assert sampled["rise"] == pytest.approx(mean) and sampled["se"] == pytest.approx(se)
    assert math.isnan(paired_rise(before, _ev({}, {}), "greedy")["rise"])


def test_a_rise_clustered_by_entity_counts_its_phrasings_once() -> None:
    """Four phrasings of one person's question that all flipped together are one piece of
    evidence, not four: the clustered error grows; singleton clusters change nothing."""
    ids = ["ann-0", "ann-1", "ann-2", "ann-3", "bo-0", "cy-0"]
    before = _ev(dict.fromkeys(ids, 0.0), {})
    after = _ev({**dict.fromkeys(ids[:4], 1.0), "bo-0": 0.0, "cy-0": 1.0}, {}, 2)
    plain = paired_rise(before, after, "greedy")
    alone = paired_rise(before, after, "greedy", {i: i for i in ids})
    assert alone["se"] == pytest.approx(plain["se"]) and alone["clusters"] == 6
    people = {i: i.split("-")[0] for i in ids}
    clustered = paired_rise(before, after, "greedy", people)
    assert clustered["rise"] == plain["rise"] and clustered["clusters"] == 3
    assert clustered["se"] > 1.25 * plain["se"]
    assert entity_clusters([Scenario(id="x", task="t")]) is None
    assert entity_clusters([Scenario(id="x", task="t", metadata={"entity": "Ann"})]) == {"x": "Ann"}


def _traj(*events: art.ToolEvent) -> art.Trajectory:
    t = art.Trajectory()
    t.tool_events.extend(events)
    return t


def test_format_and_transcript() -> None:
    s = Scenario(id="x", task="t", metadata={"tool": "lookup"})
    good = _traj(
        art.ToolEvent(name="lookup", args={"person": "Ann Bell"}, result="4821"),
        art.ToolEvent(name="complete_task", args={"answer": "4821"}, result="4821"),
    )
    assert episode_format(good, s)
    assert not episode_format(_traj(art.ToolEvent(name="lookup", error="no one")), s)
    assert not episode_format(_traj(art.ToolEvent(name="complete_task", args={})), s)
    assert not episode_format(_traj(), s)
    # Without an expected tool, any first call but complete_task is well-formed.
    assert episode_format(_traj(art.ToolEvent(name="add")), Scenario(id="y", task="t"))
    assert transcript(good) == (
        'lookup({"person": "Ann Bell"}) -> "4821" | complete_task({"answer": "4821"}) -> "4821"'
    )
    assert transcript(_traj(art.ToolEvent(name="f", error="boom"))) == "f({}) -> error: boom"
    assert transcript(_traj()).startswith("no tool call")
    assert len(transcript(_traj(art.ToolEvent(name="f", args={"x": "y" * 900})), 50)) == 50


def test_changed_examples_prefer_fixed_episodes() -> None:
    before = _ev({"a": 0.2, "b": 0.0, "c": 1.0}, {})
    after = _ev({"a": 1.0, "b": 0.2, "c": 1.0}, {}, 3)
    before.transcripts = {"a": "old a", "b": "old b", "c": "c"}
    after.transcripts = {"a": "new a", "b": "new b", "c": "c"}
    scen = [Scenario(id=i, task=f"task {i}") for i in "abc"]
    got = changed_examples(before, after, scen, k=5)
    assert [g["scenario"] for g in got] == ["a", "b"]
    assert [g["scenario"] for g in changed_examples(before, after, scen, only={"b"})] == ["b"]
    assert got[0] == {
        "scenario": "a",
        "task": "task a",
        "slice": "",
        "before": "old a",
        "before_reward": 0.2,
        "after": "new a",
        "after_reward": 1.0,
    }


def test_the_control_arm_permutes_a_step_s_rewards() -> None:
    import random

    groups = [
        art.TrajectoryGroup([art.Trajectory(reward=float(g * 4 + i)) for i in range(4)])
        for g in range(3)
    ]
    shuffle_rewards(groups, random.Random("0/1"))
    got = [t.reward for g in groups for t in g.trajectories]
    assert sorted(got) == [float(i) for i in range(12)] and got != sorted(got)
    again = [
        art.TrajectoryGroup([art.Trajectory(reward=float(g * 4 + i)) for i in range(4)])
        for g in range(3)
    ]
    shuffle_rewards(again, random.Random("0/1"))
    assert [t.reward for g in again for t in g.trajectories] == got  # seeded


def test_a_report_breaks_the_rise_down_by_slice(tmp_path) -> None:
    """Held-out scenarios labelled by `metadata["slice"]` (a wording seen in training or
    not) get their own paired rise, before and after, in report.json and its summary."""
    from art_mcp.evaluation import slices
    from art_mcp.report import append_journal, build_report, summary_lines

    scenarios = [
        Scenario(id=f"{who}-{w}", task="t", metadata={"entity": who, "slice": f"wording {w}"})
        for who in ("ann", "bo", "cy")
        for w in ("seen", "unseen")
    ]
    assert slices(scenarios)["wording seen"] == {"ann-seen", "bo-seen", "cy-seen"}
    assert slices([Scenario(id="x", task="t")]) == {}
    ids = [s.id for s in scenarios]
    before = _ev(dict.fromkeys(ids, 0.0), {})
    after = _ev({i: float(i.endswith("-seen") or i == "ann-unseen") for i in ids}, {}, 1)
    only = paired_rise(before, after, "greedy", ids={"ann-unseen", "bo-unseen"})
    assert only["n"] == 2 and only["rise"] == 0.5 and only["after"] == 0.5
    for ev in (before, after):
        append_journal(tmp_path, "evaluation", ev.model_dump())
    append_journal(tmp_path, "step", {"step": 1, "reward": 0.5})
    report = build_report(
        model="m", server="s", steps=1, folder=tmp_path, scored_by="reward", seconds=1.0,
        scenarios=scenarios,
    )  # fmt: skip
    seen, unseen = report.slices["wording seen"], report.slices["wording unseen"]
    assert seen["greedy"]["rise"] == 1.0 and seen["greedy"]["before"] == 0.0
    assert unseen["greedy"]["rise"] == pytest.approx(1 / 3) and unseen["greedy"]["n"] == 3
    # an example of each slice comes first: a fixed episode of every kind of question
    assert [ex["slice"] for ex in report.examples][:2] == ["wording seen", "wording unseen"]
    lines = "\n".join(summary_lines(report))
    assert "- wording unseen (3 scenarios): greedy 0.00 -> 0.33 (+0.33 ± " in lines
    from art_mcp.report import write_report

    write_report(report, tmp_path)  # the curve carries held-out success beside the rewards
    assert (tmp_path / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "wording unseen" in (tmp_path / "report.md").read_text()


def test_episode_calls_count_server_calls_and_repeats() -> None:
    from art_mcp.evaluation import episode_calls

    t = _traj(
        art.ToolEvent(name="project_lead", args={"project": "Amber"}),
        art.ToolEvent(name="project_lead", args={"project": "Amber"}),
        art.ToolEvent(name="lookup", args={"person": "Ann", "field": "office"}),
        art.ToolEvent(name="complete_task", args={"answer": "B2"}),
    )
    t.reward = 1.0
    c = episode_calls(t, 1.0)
    assert (c.calls, c.repeated, c.solved) == (3, 1, True)
    t.reward = 0.2
    assert not episode_calls(t, 1.0).solved


def test_a_warm_started_run_reports_rl_s_rise_apart_from_the_warm_start_s(tmp_path) -> None:
    """With an SFT warm start, the paired rise is RL's own (before RL -> last), the warm
    start's (untrained -> before RL) is reported apart, and the calls per solved episode
    are compared over the same two evaluations."""
    from art_mcp.evaluation import EpisodeCalls
    from art_mcp.report import append_journal, build_report, summary_lines

    ids = ["a", "b", "c", "d"]
    scenarios = [Scenario(id=i, task="t", metadata={"slice": "two-hop"}) for i in ids]
    untrained = _ev(dict.fromkeys(ids, 0.0), {})
    warm = Evaluation(step=1, rl_step=0, greedy={"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0})
    last = Evaluation(step=3, rl_step=2, greedy=dict.fromkeys(ids, 1.0))
    warm.calls = {"a": [EpisodeCalls(calls=4, repeated=2, solved=True)]}
    last.calls = {i: [EpisodeCalls(calls=2, repeated=0, solved=True)] for i in ids}
    for ev in (untrained, warm, last):
        append_journal(tmp_path, "evaluation", ev.model_dump())
    for step in (2, 3):
        append_journal(tmp_path, "step", {"step": step, "reward": 0.5})
    report = build_report(
        model="m", server="s", steps=2, folder=tmp_path, scored_by="reward", seconds=1.0,
        scenarios=scenarios,
    )  # fmt: skip
    assert report.paired["greedy"]["rise"] == 0.75 and report.paired["greedy"]["before"] == 0.25
    assert report.warm_start["all"]["greedy"]["rise"] == 0.25
    assert report.warm_start["two-hop"]["greedy"]["n"] == 4
    assert report.calls["two-hop"] == {
        "before": 4.0,
        "after": 2.0,
        "repeated_before": 2.0,
        "repeated_after": 0.0,
        "solved_before": 1.0,
        "solved_after": 4.0,
    }
    lines = "\n".join(summary_lines(report))
    assert "paired rise in greedy success, before RL -> last: +0.75" in lines
    assert (
        "- the SFT warm start, untrained -> before RL, two-hop (4 scenarios): greedy 0.00" in lines
    )
    assert "calls per solved episode (all), before RL -> last: 4.00 -> 2.00" in lines


def test_eval_draws_fix_each_scenario_s_kth_episode_whatever_else_is_evaluated() -> None:
    from art_mcp.evaluation import eval_draws

    a, b, c = (Scenario(id=i, task=i) for i in ("a", "b", "c"))
    jobs = [(a, True), (b, True), (a, False), (b, False), (a, False)]
    draws = eval_draws(7, jobs)
    assert len(set(draws)) == len(draws)  # each episode its own draws
    # the same scenario's k-th episode draws alike in another evaluation's jobs
    other = eval_draws(7, [(c, True), (a, True), (c, False), (a, False), (a, False)])
    assert [other[1], other[3], other[4]] == [draws[0], draws[2], draws[4]]
    assert set(eval_draws(8, jobs)).isdisjoint(draws)  # another run's seed: other draws


@pytest.mark.slow
async def test_two_evaluations_of_one_model_draw_the_same_sampled_episodes(tmp_path) -> None:
    """Common random numbers, end to end: two runs of one seed evaluate the untrained tiny
    preset on the bundled server, and each scenario's episodes come out token for token
    the same; a scenario's two sampled episodes draw apart."""
    from collections import defaultdict
    from pathlib import Path

    from art_mcp import HarnessConfig, load_scenarios, train

    root = Path(__file__).resolve().parents[2]
    scenarios = load_scenarios(root / "examples/mcp_server/scenarios.jsonl")[:24]

    async def episodes(folder: str) -> dict[str, list[tuple[int, ...]]]:
        seen: dict[str, list[tuple[int, ...]]] = defaultdict(list)

        def record(traj: art.Trajectory, s: Scenario) -> float:
            ids = [i for c in traj.calls for i in c.completion_token_ids or []]
            seen[s.id].append(tuple(ids))
            return 0.0

        cfg = HarnessConfig(
            path=str(tmp_path / folder), base_model="tiny", steps=0, sft_epochs=0,
            max_tokens=12, max_turns=2, eval_scenarios=3, eval_samples=2, val_fraction=0.25,
            seed=4,
        )  # fmt: skip
        await train("python -m examples.mcp_server.server", cfg, scenarios=scenarios,
                    reward=record, log=lambda _: None)  # fmt: skip
        return {k: sorted(v) for k, v in seen.items()}

    first, second = await episodes("a"), await episodes("b")
    assert len(first) == 3 and all(len(v) == 3 for v in first.values())  # 1 greedy + 2 sampled
    assert first == second
    assert any(len(set(v)) > 1 for v in first.values())  # not one draw for every episode
