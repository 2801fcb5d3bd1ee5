"""examples/bfcl: BFCL's checker across its environment's boundary, the split by function
name, the partial-credit reward, and the app end to end (real graph, backend and checker).

The `bfcl` tests need `.venv-bfcl` (scripts/setup-bfcl.sh; the test command builds it)."""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage

import art_langgraph as art
from examples.bfcl.answers import DECLINE, calls_of, partial_credit
from examples.bfcl.app import (
    TRAINED,
    Run,
    Tally,
    _check_args,
    parser,
    rollout_diagnostics,
    step_categories,
)
from examples.bfcl.checker import CATEGORIES, BfclChecker
from examples.bfcl.leaderboard import beside, load
from examples.bfcl.record import code_hash
from examples.bfcl.splits import EVAL_PER_CATEGORY, load_splits, make_splits
from examples.bfcl.whole import Progress, render

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checker() -> object:
    with BfclChecker() as c:
        yield c


@pytest.mark.bfcl
def test_bfcls_checker_judges_calls_as_bfcl_does(checker: BfclChecker) -> None:
    item = next(i for i in checker.items("simple_python") if i["id"] == "simple_python_1")
    assert item["ground_truth"] == [{"math.factorial": {"number": [5]}}]
    # BFCL's convert_to_tool: dots to underscores, its types to JSON Schema's
    (tool,) = item["tools"]
    assert tool["function"]["name"] == "math_factorial"
    assert tool["function"]["parameters"]["type"] == "object"
    assert checker.check(item, [{"math_factorial": {"number": 5}}])["valid"]
    twice = checker.check(item, [{"math_factorial": {"number": 5}}] * 2)
    assert twice["error_type"] == "simple_function_checker:wrong_count"
    assert not checker.check(item, [{"math_factorial": {"number": 6}}])["valid"]
    assert not checker.check(item, [])["valid"]
    irrelevant = checker.items("irrelevance")[0]
    assert checker.check(irrelevant, [])["valid"]
    assert not checker.check(irrelevant, [{"anything": {}}])["valid"]


@pytest.mark.bfcl
def test_declining_is_no_call_so_it_passes_irrelevance_and_fails_a_call(
    checker: BfclChecker,
) -> None:
    def answer(*names: str) -> dict[str, object]:
        calls = [{"name": n, "args": {}, "id": f"c{i}"} for i, n in enumerate(names)]
        return {"messages": [AIMessage(content="", tool_calls=calls)]}

    irrelevant = checker.items("irrelevance")[0]
    assert calls_of(answer(DECLINE)) == []
    assert checker.check(irrelevant, calls_of(answer(DECLINE)))["valid"]
    some = irrelevant["tools"][0]["function"]["name"]
    assert not checker.check(irrelevant, calls_of(answer(some)))["valid"]
    item = next(i for i in checker.items("simple_python") if i["id"] == "simple_python_1")
    assert not checker.check(item, calls_of(answer(DECLINE)))["valid"]
    assert calls_of(answer(DECLINE, DECLINE)) == []  # declining twice is still no call


@pytest.mark.bfcl
async def test_a_pass_by_declining_several_times_earns_less_under_once_and_tiebreak() -> None:
    """BFCL passes an irrelevance item on any number of `decline` calls; `--decline-reward
    once` and `tiebreak` pay a repeated decline less (the calling items fail on repeated
    calls), `any` (the default) pays it in full; a failure earns the same either way."""

    def answer(*names: str) -> dict[str, object]:
        calls = [{"name": n, "args": {}, "id": f"c{i}"} for i, n in enumerate(names)]
        return {"messages": [AIMessage(content="", tool_calls=calls)]}

    run = Run(parser().parse_args([]))
    try:
        irrelevant = run.checker.items("irrelevance")[0]
        some = irrelevant["tools"][0]["function"]["name"]
        rewards = {}
        for mode in ("any", "once", "tiebreak"):
            run.args = parser().parse_args(["--decline-reward", mode])
            rewards[mode] = [
                await run.reward(irrelevant, answer(*[DECLINE] * n)) for n in (1, 2, 3)
            ] + [await run.reward(irrelevant, answer(some))]
    finally:
        run.checker.close()
    assert rewards["any"] == [1.0, 1.0, 1.0, 0.0]
    assert rewards["once"] == pytest.approx([1.0, 1 / 2, 1 / 3, 0.0])
    assert rewards["tiebreak"] == pytest.approx([1.0, 0.9, 0.9, 0.0])


@pytest.mark.bfcl
def test_declining_beside_a_call_fails_both_ways(checker: BfclChecker) -> None:
    """A hedge (`decline` and a function in one answer) passes neither an irrelevance item
    nor a calling item that the function alone would pass."""

    def answer(*calls: tuple[str, dict[str, object]]) -> dict[str, object]:
        tcs = [{"name": n, "args": a, "id": f"c{i}"} for i, (n, a) in enumerate(calls)]
        return {"messages": [AIMessage(content="", tool_calls=tcs)]}

    item = next(i for i in checker.items("simple_python") if i["id"] == "simple_python_1")
    right = ("math_factorial", {"number": 5})
    assert checker.check(item, calls_of(answer(right)))["valid"]
    for hedge in (answer(right, (DECLINE, {})), answer((DECLINE, {}), right)):
        assert not checker.check(item, calls_of(hedge))["valid"]
    irrelevant = checker.items("irrelevance")[0]
    some = (irrelevant["tools"][0]["function"]["name"], {})
    assert not checker.check(irrelevant, calls_of(answer((DECLINE, {}), some)))["valid"]


@pytest.mark.bfcl
def test_an_evaluation_counts_its_failures_by_bfcls_error_type(checker: BfclChecker) -> None:
    item = next(i for i in checker.items("simple_python") if i["id"] == "simple_python_1")
    tally = Tally()
    tally.add("k", "right", checker.check(item, [{"math_factorial": {"number": 5}}]))
    tally.add("k", "twice", checker.check(item, [{"math_factorial": {"number": 5}}] * 2))
    tally.add("k", "value", checker.check(item, [{"math_factorial": {"number": 6}}]))
    tally.add("k", "lost", "APITimeoutError: Request timed out.")
    assert tally.per_item["k"] == {"right": True, "twice": False, "value": False, "lost": False}
    assert tally.error_types == {
        "k": {
            "simple_function_checker:wrong_count": 1,
            "value_error:others": 1,
            "request_failed": 1,
        }
    }


def test_the_steps_draw_every_trained_category_in_turn() -> None:
    drawn = [c for step in range(len(TRAINED)) for c in step_categories(step, 8)]
    assert {c: drawn.count(c) for c in TRAINED} == {c: 8 * TRAINED.count(c) for c in TRAINED}
    assert TRAINED.count("irrelevance") == 1  # 1 group in 3: the mix chosen on validation
    assert step_categories(1, 8)[0] == TRAINED[8 % len(TRAINED)]  # continued, not restarted
    half = step_categories(0, 8, ("simple_python", "irrelevance", "multiple", "irrelevance"))
    assert half.count("irrelevance") == 4


def test_a_run_may_train_on_categories_the_default_mix_leaves_out() -> None:
    args = _check_args(parser().parse_args(["--train-categories", "parallel,irrelevance"]))
    assert args.train_categories == "parallel,irrelevance"
    with pytest.raises(SystemExit, match="unknown"):
        _check_args(parser().parse_args(["--train-categories", "simple_java"]))


@pytest.mark.bfcl
def test_a_run_evaluates_along_the_way_only_at_steps_it_takes() -> None:
    args = _check_args(parser().parse_args(["--steps", "12", "--eval-at", "6,3,6"]))
    assert args.eval_at == [3, 6]
    for bad in ("12", "0"):
        with pytest.raises(SystemExit, match="--eval-at"):
            _check_args(parser().parse_args(["--steps", "12", "--eval-at", bad]))


def test_java_and_javascript_are_served_as_bfcl_serves_them(checker: BfclChecker) -> None:
    item = checker.items("simple_java")[0]
    ((name, params),) = item["ground_truth"][0].items()
    # the model sees BFCL's language hint: every parameter a string holding a Java literal
    props = item["tools"][0]["function"]["parameters"]["properties"]
    assert {p["type"] for p in props.values()} == {"string"}
    right = {name.replace(".", "_"): {k: str(v[0]) for k, v in params.items() if v[0] != ""}}
    assert checker.check(item, [right])["valid"]
    js = checker.items("simple_javascript")[0]  # a JavaScript boolean is `true`, not `True`
    assert not checker.check(js, [{"validateUserInput": {"inputField": "userInputField", "isComplete": "True"}}])["valid"]  # fmt: skip
    assert checker.check(js, [{"validateUserInput": {"inputField": "userInputField", "isComplete": "true"}}])["valid"]  # fmt: skip


@pytest.mark.bfcl
def test_the_non_live_overall_is_bfcls_arithmetic(checker: BfclChecker) -> None:
    def d(accuracy: float, n: int) -> dict[str, float]:
        return {"accuracy": accuracy, "total_count": n}

    scores = {"simple_python": d(0.9, 400), "simple_java": d(0.6, 100)}
    scores |= {"simple_javascript": d(0.5, 50), "multiple": d(0.8, 200)}
    scores |= {"parallel": d(0.7, 200), "parallel_multiple": d(0.6, 200)}
    got = checker.overall(scores)
    assert got["simple"] == pytest.approx((0.9 + 0.6 + 0.5) / 3)
    assert got["non_live"] == pytest.approx((got["simple"] + 0.8 + 0.7 + 0.6) / 4)


@pytest.mark.bfcl
def test_the_leaderboards_rows_are_bfcls_arithmetic_of_their_columns(checker: BfclChecker) -> None:
    """The copied leaderboard rows are whole: BFCL's own code, given a row's categories,
    gives the row's non-live overall (to the table's two decimals of a percent)."""
    rows = load()["rows"]
    assert len(rows) >= 5
    for row in rows:
        cats = ("simple_python", "simple_java", "simple_javascript", "multiple")
        cats += ("parallel", "parallel_multiple")
        scores = {c: {"accuracy": row[c], "total_count": 100} for c in cats}
        assert checker.overall(scores)["non_live"] == pytest.approx(row["non_live"], abs=1e-4)


@pytest.mark.bfcl
def test_a_bad_request_is_a_clear_error_and_the_service_goes_on(checker: BfclChecker) -> None:
    with pytest.raises(RuntimeError, match="live_simple"):
        checker.items("live_simple")  # a transfer-test category: never served
    assert len(checker.items("multiple")) == 200


def test_no_held_out_function_occurs_in_training() -> None:
    splits = load_splits()
    for c in CATEGORIES:
        train, val, held = (set(splits[k][c]) for k in ("train", "validation", "heldout"))
        assert not (train & held or val & held or train & val)
        assert len(splits["eval_sample"][c]) == EVAL_PER_CATEGORY
        assert set(splits["eval_sample"][c]) <= held


@pytest.mark.bfcl
def test_the_committed_splits_are_bfcls_items_split_by_function_name(
    checker: BfclChecker,
) -> None:
    items = [it for c in CATEGORIES for it in checker.items(c)]
    assert make_splits(items) == load_splits()  # reproducible from BFCL's data
    splits = load_splits()
    names = {it["id"]: {f["name"] for f in it["function"]} for it in items}
    held = {n for c in CATEGORIES for i in splits["heldout"][c] for n in names[i]}
    seen = {
        n
        for k in ("train", "validation")
        for c in CATEGORIES
        for i in splits[k][c]
        for n in names[i]
    }
    assert not held & seen
    assert sum(
        len(v) for k in ("train", "validation", "heldout") for v in splits[k].values()
    ) == len(items)


def test_partial_credit_decomposes_name_parameters_and_values() -> None:
    item = {"ground_truth": [{"math.hypot": {"x": [4], "y": [5], "z": ["", 0]}}]}
    assert partial_credit(item, [{"math_hypot": {"x": 4, "y": 5}}]) == pytest.approx(1.0)
    # right name, right parameter names, one value of two wrong
    assert partial_credit(item, [{"math_hypot": {"x": 4, "y": 6}}]) == pytest.approx(0.85)
    # right name, one of two parameters: names 1/2, values 1/2
    assert partial_credit(item, [{"math_hypot": {"x": 4}}]) == pytest.approx(0.4 + 0.15 + 0.15)
    assert partial_credit(item, [{"other": {"x": 4, "y": 5}}]) == 0.0
    # the same right call twice: half the credit (one call expected, two made)
    assert partial_credit(item, [{"math_hypot": {"x": 4, "y": 5}}] * 2) == pytest.approx(0.5)
    assert partial_credit(item, []) == 0.0


def test_a_steps_diagnostics_say_whether_its_rewards_favoured_fewer_calls() -> None:
    def group(rows: list[tuple[float, int]]) -> list[art.Trajectory]:
        return [art.Trajectory(reward=r, metrics={"calls": c, "bfcl_pass": r == 1.0}) for r, c in rows]  # fmt: skip

    fewer_won = group([(1.0, 1), (0.2, 3), (0.2, 4), (1.0, 1)])
    flat = group([(0.1, 2), (0.1, 2), (0.1, 3), (0.1, 5)])  # one reward: no push either way
    got = rollout_diagnostics([fewer_won, flat])
    assert got["rollout_calls_mean"] == pytest.approx(21 / 8)
    assert got["rollout_pass_rate"] == pytest.approx(2 / 8)
    assert got["trained_reward_calls_correlation"] < -0.5
    assert rollout_diagnostics([flat])["trained_reward_calls_correlation"] == 0.0


def _example(module: str, *args: str) -> None:
    """Run `python -m <module> <args>` as a user does; its stderr on failure."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.bfcl
async def test_a_failed_request_is_a_failed_item_and_the_evaluation_goes_on() -> None:
    from art_langgraph.tracing.chat_model import build_chat_model

    with socket.socket() as s:  # a port nothing listens on: the server has gone
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    chat = build_chat_model(
        name="m", step=None, base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0
    )
    run = Run(argparse.Namespace())
    try:
        item = run.checker.items("simple_python")[0]
        answer = await run.answer(item, chat, "required")
    finally:
        run.checker.close()
    assert isinstance(answer, str) and "ConnectionError: Connection error" in answer
    tally = Tally()
    tally.add("simple_python/greedy", item["id"], answer)
    for i in range(3):
        tally.add("simple_python/greedy", f"other_{i}", True)
    assert tally.per_item["simple_python/greedy"][item["id"]] is False
    assert tally.errors == {"simple_python/greedy": [f"{item['id']}: {answer}"]}
    tally.check("untrained")  # 1 of 4 failed: counted, and the evaluation goes on
    tally.add("multiple/greedy", "other_4", "APITimeoutError: Request timed out.")
    with pytest.raises(RuntimeError, match="untrained: 2 of 5 requests failed"):
        tally.check("untrained")


@pytest.mark.slow
@pytest.mark.bfcl
def test_the_app_trains_and_scores_end_to_end(tmp_path: Path) -> None:
    _example("examples.bfcl", "--base-model", "tiny", "--steps", "2", "--eval-at", "1", "--eval-limit", "2", "--out", str(tmp_path))  # fmt: skip
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["args"]["steps"] == 2 and len(result["steps"]) == 2
    for when in ("before", "after"):  # every failed item counted by BFCL's error type
        failed = {k: sum(not p for p in v.values()) for k, v in result["per_item"][when].items()}
        counted = {k: sum(result["error_types"][when].get(k, {}).values()) for k in failed}
        assert counted == failed
    # --eval-at 1: the model after step 1, scored against the untrained one as the end is
    mid = result["at_steps"]["1"]
    assert set(mid["accuracy"]) == set(result["accuracy"])
    assert (
        mid["accuracy"]["simple_python/greedy"]["before"]
        == (result["accuracy"]["simple_python/greedy"]["before"])
    )
    assert "evaluation after 1 steps" in result["phases_s"]
    assert set(result["accuracy"]) >= {"simple_python/greedy", "irrelevance/greedy_auto"}
    for c in ("simple_python", "irrelevance"):
        assert len(result["per_item"]["before"][f"{c}/greedy"]) == 2
    assert result["commit"] and result["cpu_flags"] and result["peak_rss_gib"] > 0
    # the step trained on the graph's captured calls: 8 groups of 4
    assert result["steps"][0]["metrics"]["trajectories"] == 32
    # each phase's own peak, and what the step's rollouts did
    phases = {"untrained evaluation", "rollouts", "training", "intermediate evaluations"}
    phases.add("final evaluation")
    assert set(result["peak_rss_gib_by_phase"]) == phases
    assert result["peak_rss_gib"] == max(result["peak_rss_gib_by_phase"].values())
    assert result["peak_rss_phases_apart"] is True  # Linux: each phase its own peak
    step = result["steps"][0]
    assert step["rollout_calls_mean"] >= 0 and 0 <= step["rollout_pass_rate"] <= 1
    assert -1 <= step["trained_reward_calls_correlation"] <= 1


@pytest.fixture(scope="module")
def ci_arm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kept run of the CI arm's shape on the tiny model: one step of 4 groups, greedy on
    two validation items of simple_python."""
    out = tmp_path_factory.mktemp("ci_arm")
    args = ["--base-model", "tiny", "--steps", "1", "--groups-per-step", "4"]
    args += ["--eval-categories", "simple_python", "--eval-modes", "greedy", "--eval-limit", "2"]
    args += ["--eval-split", "validation", "--train-categories", "simple_python"]
    _example("examples.bfcl", *args, "--out", str(out))
    return out


@pytest.mark.slow
@pytest.mark.bfcl
def test_the_ci_arm_evaluates_only_what_it_names(ci_arm_run: Path) -> None:
    result = json.loads((ci_arm_run / "result.json").read_text())
    assert set(result["accuracy"]) == {"simple_python/greedy"}
    scored = set(result["per_item"]["before"]["simple_python/greedy"])
    assert scored <= set(load_splits()["validation"]["simple_python"]) and len(scored) == 2
    assert result["calling_mean_greedy_rise"] == result["accuracy"]["simple_python/greedy"]["rise"]
    assert result["steps"][0]["metrics"]["trajectories"] == 16  # 4 groups of 4
    assert result["code"] and result["allocator"] in ("tcmalloc", "glibc")


@pytest.mark.slow
@pytest.mark.bfcl
def test_the_whole_categories_score_a_kept_run_untrained_and_after(ci_arm_run: Path) -> None:
    """It resumes too: a category already in `whole.partial.json` under this code, limit and
    trained run is kept, not scored again (two planted passes the untrained model never makes)."""
    trained = hashlib.sha256((ci_arm_run / "result.json").read_bytes()).hexdigest()
    stamp = {"code": code_hash(), "limit": 2, "run": trained}
    planted = {"simple_java_0": True, "simple_java_1": True}
    (ci_arm_run / "whole.partial.json").write_text(
        json.dumps(
            {
                "stamp": stamp,
                "seconds": {"untrained/simple_java": 1.0},
                "per_item": {"untrained/simple_java": planted},
                "errors": {},
                "error_types": {},
            }
        )
    )
    _example("examples.bfcl.whole", "--run", str(ci_arm_run), "--limit", "2")
    whole = json.loads((ci_arm_run / "whole.json").read_text())
    cats = whole["table"]["after"]["categories"]
    assert set(cats) == {*CATEGORIES, "simple_java", "simple_javascript", "irrelevance_auto"}
    assert all(c["total_count"] == 2 for c in cats.values())
    assert 0 <= whole["table"]["untrained"]["non_live"] <= 1 and whole["code"]
    assert whole["per_item"]["untrained/simple_java"] == planted and whole["resumed"]
    assert len(whole["per_item"]["after/simple_java"]) == 2
    placed = beside(whole).splitlines()
    assert len(placed) == 2 + len(load()["rows"]) + 2 and "untrained" in placed[-2]
    assert f"{whole['table']['after']['non_live']:.2f}" == placed[-1].split(" | ")[1]
    assert not (ci_arm_run / "whole.partial.json").exists()


def test_whole_progress_resumes_only_under_the_same_stamp(tmp_path: Path) -> None:
    path = tmp_path / "whole.partial.json"
    first = Progress(path, {"code": "a"})
    first.tally.add("untrained/multiple", "multiple_0", True)
    first.save("untrained/multiple", 3.0)
    again = Progress(path, {"code": "a"})
    assert again.resumed and again.done("untrained/multiple")
    assert again.tally.per_item == {"untrained/multiple": {"multiple_0": True}}
    other = Progress(path, {"code": "b"})
    assert not other.resumed and not other.done("untrained/multiple")
    assert other.tally.per_item == {}


def test_the_whole_table_labels_exactly_what_the_run_trained_on() -> None:
    """The label "half of it trained on" marks the run's own --train-categories, irrelevance
    (and its "auto" row) included, and never a category the run's mix left out."""
    row = {"accuracy": 0.5, "total_count": 2}
    cats = ("simple_python", "parallel", "simple_java", "irrelevance", "irrelevance_auto")
    side = {"categories": dict.fromkeys(cats, row), "simple": 0.5, "non_live": 0.5}
    table = render(
        {
            "table": {"untrained": side, "after": side},
            "trained_on_half": ["simple_python", "multiple", "irrelevance"],
        }
    )
    marked = {line.split(" ")[1] for line in table.splitlines() if "half of it" in line}
    assert marked == {"simple_python", "irrelevance", "irrelevance,"}


@pytest.mark.bfcl
def test_the_one_command_sets_up_and_runs_the_example() -> None:
    """`scripts/bfcl.sh`, which the README names: both environments set up (a re-run skips
    what is current), then `python -m examples.bfcl` with the arguments given."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "bfcl.sh"), "--help"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--control" in out.stdout and "--seed" in out.stdout
