"""Score configs and held-out evaluations as Langfuse dataset runs, against the local
receiver of Langfuse's public API (`receiver.py`).

What a Langfuse server would hold is asserted through the same public API a user reads
(`GET /api/public/datasets/{name}/runs/{run}`, the SDK's dataset-item and score-config
clients): configs made once and reused, clashes refused with their reason, one item per
scenario under a stable id, one run per evaluation with its trajectories' traces linked
and scores that name their configs, unsent evaluations recorded and re-sent by `export`.
The last test runs `art_mcp.train` on the tiny preset with Langfuse configured.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from langfuse.api import LangfuseAPI

import art_langgraph as art
from art_langgraph.integrations.langfuse import LangfuseConfig, export_folder, trace_id_for
from art_langgraph.integrations.langfuse.datasets import (
    EVALUATIONS_FILE,
    DatasetClashError,
    check_dataset,
    item_id,
    log_evaluation,
)
from art_langgraph.integrations.langfuse.gate import promote_from_langfuse, run_score
from art_langgraph.integrations.langfuse.scoring import (
    REVIEW_DECISION,
    REVIEW_SCORE,
    REWARD,
    RULER_SCORE,
    SCORE_CONFIGS,
    SUCCESS,
    SUCCESS_RATE,
    ScoreConfigClashError,
    ensure_score_configs,
)
from art_langgraph.serving.runner import ServerHandle
from art_mcp.report import journal_evaluations
from tests.integrations.langfuse.receiver import Receiver, base_url

ROOT = Path(__file__).resolve().parents[3]


def _config(handle: ServerHandle) -> LangfuseConfig:
    return LangfuseConfig(
        public_key="pk-test", secret_key="sk-test", base_url=base_url(handle), timeout_s=5
    )


def _api(handle: ServerHandle) -> LangfuseAPI:
    return LangfuseAPI(
        base_url=base_url(handle),
        username="pk-test",
        password="sk-test",
        x_langfuse_public_key="pk-test",
        x_langfuse_sdk_name="python",
    )


def _get(handle: ServerHandle, path: str) -> Any:
    r = httpx.get(f"{base_url(handle)}/{path}", auth=("pk-test", "sk-test"))
    r.raise_for_status()
    return r.json()


SCENARIOS: list[dict[str, Any]] = [
    {"id": "s1", "task": "What is 2 plus 3?", "answer": "5", "difficulty": 1},
    {
        "id": "s2",
        "task": "What is 4 plus 4?",
        "answer": "8",
        "metadata": {"source_trace_id": "ab" * 16},
    },
]


def _evaluated(step: int) -> list[tuple[dict[str, Any], art.Trajectory]]:
    """Two trajectories per scenario (greedy, sampled); s1 solved from step 1 on."""
    pairs = []
    for s in SCENARIOS:
        for k in range(2):
            t = art.Trajectory(
                messages=[
                    {"role": "user", "content": s["task"]},
                    {"role": "assistant", "content": s["answer"] if step else "?"},
                ],
                reward=1.0 if (step and s["id"] == "s1") else 0.25 * k,
                metadata={"scenario": s["id"]},
            )
            pairs.append((s, t))
    return pairs


def test_score_configs_are_created_once_then_reused(
    receiver: tuple[Receiver, ServerHandle],
) -> None:
    rec, handle = receiver
    first = ensure_score_configs(_api(handle))
    assert set(first) == {c.name for c in SCORE_CONFIGS}
    assert len(rec.score_configs) == len(SCORE_CONFIGS)
    by_name = {c["name"]: c for c in rec.score_configs.values()}
    assert by_name[REWARD]["dataType"] == "NUMERIC"
    assert by_name[REWARD]["minValue"] is None and by_name[REWARD]["maxValue"] is None
    assert (by_name[RULER_SCORE]["minValue"], by_name[RULER_SCORE]["maxValue"]) == (0, 1)
    assert (by_name[REVIEW_SCORE]["minValue"], by_name[REVIEW_SCORE]["maxValue"]) == (0, 1)
    assert by_name[REVIEW_DECISION]["dataType"] == "CATEGORICAL"
    assert {(c["label"], c["value"]) for c in by_name[REVIEW_DECISION]["categories"]} == {
        ("approve", 1),
        ("reject", 0),
    }
    assert by_name[SUCCESS]["dataType"] == "BOOLEAN"

    posts = rec.requests.count("POST /api/public/score-configs")
    second = ensure_score_configs(_api(handle))
    assert second == first  # same ids, nothing created
    assert rec.requests.count("POST /api/public/score-configs") == posts


def test_a_compatible_config_of_someone_else_is_reused(
    receiver: tuple[Receiver, ServerHandle],
) -> None:
    rec, handle = receiver
    theirs = rec.add_score_config({"name": RULER_SCORE, "dataType": "NUMERIC"})  # unbounded
    ids = ensure_score_configs(_api(handle))
    assert ids[RULER_SCORE] == theirs["id"]
    assert sum(c["name"] == RULER_SCORE for c in rec.score_configs.values()) == 1


@pytest.mark.parametrize(
    ("existing", "reason"),
    [
        ({"name": REWARD, "dataType": "CATEGORICAL", "categories": []}, "is CATEGORICAL"),
        ({"name": REWARD, "dataType": "NUMERIC", "minValue": 0, "maxValue": 1}, "range"),
        (
            {
                "name": REVIEW_DECISION,
                "dataType": "CATEGORICAL",
                "categories": [{"label": "good", "value": 1}],
            },
            "approve=1, reject=0",
        ),
        ({"name": SUCCESS, "dataType": "BOOLEAN", "isArchived": True}, "archived"),
    ],
)
def test_a_config_name_clash_is_a_clear_error(
    receiver: tuple[Receiver, ServerHandle], existing: dict[str, Any], reason: str
) -> None:
    rec, handle = receiver
    rec.add_score_config(existing)
    with pytest.raises(ScoreConfigClashError, match=reason) as err:
        ensure_score_configs(_api(handle))
    assert err.value.name == existing["name"] and "Archive or rename" in str(err.value)


def test_every_exported_score_references_its_config(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path
) -> None:
    rec, handle = receiver
    res = log_evaluation(
        "arith-held-out", "agent@0", _evaluated(0), folder=tmp_path, config=_config(handle)
    )
    assert res.sent, res.error
    names = {c["id"]: c["name"] for c in rec.score_configs.values()}
    assert rec.scores and all(names[s["configId"]] == s["name"] for s in rec.scores.values())


def test_evaluations_become_one_dataset_run_each(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path
) -> None:
    rec, handle = receiver
    cfg = _config(handle)
    evaluated = {step: _evaluated(step) for step in (0, 1)}
    for step in (0, 1):
        res = log_evaluation(
            "arith-held-out",
            f"agent@{step}",
            evaluated[step],
            metadata={"step": step},
            folder=tmp_path,
            config=cfg,
        )
        assert res.sent and res.items == 2 and res.run_items == 4, res

    # the dataset: created with our marker; one item per scenario, by its stable id
    api = _api(handle)
    ds = api.datasets.get(dataset_name="arith-held-out")
    assert ds.metadata == {"art_langgraph": "held_out"}
    items = {i.id: i for i in api.dataset_items.list(dataset_name="arith-held-out").data}
    assert set(items) == {item_id("arith-held-out", "s1"), item_id("arith-held-out", "s2")}
    s1, s2 = items[item_id("arith-held-out", "s1")], items[item_id("arith-held-out", "s2")]
    assert (s1.input, s1.expected_output) == ("What is 2 plus 3?", "5")
    assert s1.metadata == {"scenario_id": "s1", "difficulty": 1}
    assert s1.source_trace_id is None and s2.source_trace_id == "ab" * 16
    assert len(rec.requests) and rec.requests.count("POST /api/public/v2/datasets") == 1

    # one run per evaluation, its items linking the trajectories' traces
    runs = _get(handle, "api/public/datasets/arith-held-out/runs")["data"]
    assert sorted(r["name"] for r in runs) == ["agent@0", "agent@1"]
    run1 = _get(handle, "api/public/datasets/arith-held-out/runs/agent@1")
    assert run1["metadata"]["step"] == 1 and run1["metadata"]["success_rate"] == 0.5
    linked = {(r["datasetItemId"], r["traceId"]) for r in run1["datasetRunItems"]}
    want = {(item_id("arith-held-out", s["id"]), trace_id_for(t)) for s, t in evaluated[1]}
    assert linked == want

    # per trace: reward and success; per run: mean reward and success rate
    configs = {c["name"]: c["id"] for c in rec.score_configs.values()}
    for _, t in evaluated[1]:
        tid = trace_id_for(t)
        assert rec.scores[f"{tid}-{REWARD}"]["configId"] == configs[REWARD]
        success = rec.scores[f"{tid}-{SUCCESS}"]
        assert success["configId"] == configs[SUCCESS] and success["value"] == (t.reward >= 1)
    by_run = {
        (s["datasetRunId"], s["name"]): s["value"]
        for s in rec.scores.values()
        if s.get("datasetRunId")
    }
    assert by_run[(run1["id"], SUCCESS_RATE)] == 0.5
    assert by_run[(run1["id"], REWARD)] == pytest.approx((1 + 1 + 0 + 0.25) / 4)
    assert all(
        s["configId"] == configs[s["name"]] for s in rec.scores.values() if s.get("datasetRunId")
    )
    lines = [json.loads(x) for x in (tmp_path / EVALUATIONS_FILE).read_text().splitlines()]
    assert [x["status"] for x in lines] == ["sent", "sent"]


def test_a_dataset_name_clash_is_a_clear_error(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path
) -> None:
    rec, handle = receiver
    rec.add_dataset("arith-held-out", {"owner": "the support team"})
    with pytest.raises(DatasetClashError, match="is not an art_langgraph held-out dataset"):
        log_evaluation(
            "arith-held-out", "agent@0", _evaluated(0), folder=tmp_path, config=_config(handle)
        )
    assert not rec.dataset_items and not rec.dataset_runs
    # recorded, so it can go once the clash is resolved
    assert json.loads((tmp_path / EVALUATIONS_FILE).read_text())["status"] == "unsent"


@pytest.mark.parametrize("failure", [500, 400, "down"])
def test_a_failing_langfuse_is_recorded_and_resent_by_export(
    receiver: tuple[Receiver, ServerHandle],
    tmp_path: Path,
    failure: int | str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec, handle = receiver
    folder = tmp_path / "proj" / "models" / "agent"
    (folder / "trajectories").mkdir(parents=True)
    cfg = _config(handle)
    if failure == "down":
        cfg = cfg.model_copy(update={"base_url": "http://127.0.0.1:9"})  # nothing listens
    else:
        rec.fail_with = int(failure)
    res = log_evaluation("arith-held-out", "agent@0", _evaluated(0), folder=folder, config=cfg)
    assert not res.sent and res.error
    assert "not sent" in caplog.text and "art-langgraph langfuse export" in caplog.text
    recorded = json.loads((folder / EVALUATIONS_FILE).read_text())
    assert recorded["status"] == "unsent" and recorded["run_name"] == "agent@0"
    assert not rec.dataset_runs

    rec.fail_with = None
    report = export_folder(folder, config=_config(handle))
    assert report.evaluations == 1 and not report.failed_evaluations
    run = _get(handle, "api/public/datasets/arith-held-out/runs/agent@0")
    assert len(run["datasetRunItems"]) == 4
    # sent now: a second export sends nothing again
    assert export_folder(folder, config=_config(handle)).evaluations == 0
    assert len(rec.dataset_run_items) == 4


_calls = itertools.count()


def _varied(traj: art.Trajectory, scenario: Any) -> float:
    """0 and 1 in turn: rollouts of the tiny model may be identical, and the task's own
    reward gives them all one score, so the step would train on nothing, and an adapter no
    step changed is not evaluated again: the loop needs an evaluation after RL step 1."""
    return float(next(_calls) % 2)


@pytest.mark.slow
async def test_art_mcp_train_closes_the_langfuse_loop(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_mcp import HarnessConfig, train

    rec, handle = receiver
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-test")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-test")
    monkeypatch.setenv("LANGFUSE_BASE_URL", base_url(handle))
    monkeypatch.delenv("ART_LANGFUSE", raising=False)
    cfg = HarnessConfig(
        path=str(tmp_path),
        base_model="tiny",
        steps=1,
        group_size=2,
        groups_per_step=1,
        sft_epochs=0,
        max_tokens=16,
        max_turns=1,
        tool_choice="required",
        eval_scenarios=2,
        eval_samples=1,
        val_fraction=0.1,
        review_queue="mcp-review",
        review_fraction=1.0,
        promote_on_evaluation=True,
    )
    said: list[str] = []
    report = await train(
        "python -m examples.mcp_server.server",
        cfg,
        scenarios=ROOT / "examples/mcp_server/scenarios.jsonl",
        reward=_varied,
        log=said.append,
    )
    name = Path(report.folder).name
    dataset = f"mcp-{name}-held-out"
    assert dataset in rec.datasets and len(rec.dataset_items) == 2
    runs = _get(handle, f"api/public/datasets/{dataset}/runs")["data"]
    assert sorted(r["name"] for r in runs) == [f"{name}@0", f"{name}@1"]
    for r in runs:
        run = _get(handle, f"api/public/datasets/{dataset}/runs/{r['name']}")
        assert len(run["datasetRunItems"]) == 4  # 2 scenarios x (greedy + 1 sample)
        for ri in run["datasetRunItems"]:
            assert ri["traceId"] in rec.traces  # the exporter sent the trace itself
            assert rec.scores[f"{ri['traceId']}-{SUCCESS}"]["configId"]
        assert {s["name"] for s in rec.scores.values() if s.get("datasetRunId") == r["id"]} == {
            REWARD,
            SUCCESS_RATE,
        }
    assert f"Langfuse: the untrained model's held-out evaluation is dataset run {name}@0" in said
    assert f"Langfuse: held-out evaluation after RL step 1 is dataset run {name}@1" in said
    lines = (Path(report.folder) / EVALUATIONS_FILE).read_text().splitlines()
    assert [json.loads(x)["status"] for x in lines] == ["sent", "sent"]

    # the review queue, tied to the review score configs, holds the trained rollouts
    folder = Path(report.folder)
    trained = [
        t
        for f in (folder / "trajectories/train").glob("*.jsonl")
        for g in art.read_groups(f)
        for t in g
    ]
    (queue,) = rec.queues.values()
    assert queue["name"] == "mcp-review" and len(queue["scoreConfigIds"]) == 2
    assert {i["objectId"] for i in rec.queue_items.values()} == {trace_id_for(t) for t in trained}

    # promotion decisions follow the evaluations: step 1 is promoted iff its held-out
    # greedy reward is at least step 0's minus the tolerance
    journal = [json.loads(x) for x in (folder / "evaluations.jsonl").read_text().splitlines()]
    greedy = [e.greedy_reward for e in journal_evaluations(journal)]
    decisions = [json.loads(x) for x in (folder / "promotion.jsonl").read_text().splitlines()]
    evaluated = [d for d in decisions if d["action"] == "evaluation"]
    assert [d["step"] for d in evaluated] == [0, 1]
    assert [d["score"] for d in evaluated] == greedy
    tolerance = art.ModelConfig().promotion_tolerance
    assert evaluated[1]["promoted"] == (greedy[1] >= greedy[0] - tolerance)
    assert evaluated[-1]["served"] == (1 if evaluated[1]["promoted"] else 0)


def test_a_clashing_dataset_is_found_before_a_run_starts(
    receiver: tuple[Receiver, ServerHandle],
) -> None:
    rec, handle = receiver
    rec.add_dataset("theirs", {"owner": "the support team"})
    with pytest.raises(DatasetClashError, match="is not an art_langgraph held-out dataset"):
        check_dataset("theirs", config=_config(handle))
    check_dataset("free-name", config=_config(handle))  # missing: fine, made at the first run
    log_evaluation("ours", "agent@0", _evaluated(0), config=_config(handle))
    check_dataset("ours", config=_config(handle))  # ours: fine
    down = LangfuseConfig(
        public_key="pk", secret_key="sk", base_url="http://127.0.0.1:9", timeout_s=2
    )
    check_dataset("theirs", config=down)  # unreachable: a warning, the run goes on


def test_run_score_reads_a_runs_aggregate_back_from_langfuse(
    receiver: tuple[Receiver, ServerHandle],
) -> None:
    rec, handle = receiver
    cfg = _config(handle)
    log_evaluation("arith-held-out", "agent@1", _evaluated(1), config=cfg)
    # the run's own score, as log_evaluation sent it: rewards 1, 1, 0, 0.25 -> 0.5625
    assert run_score("arith-held-out", "agent@1", config=cfg) == pytest.approx(0.5625)
    # a score only its traces carry (a reviewer's): the mean over the run's traces
    run = _get(handle, "api/public/datasets/arith-held-out/runs/agent@1")
    traces = sorted({i["traceId"] for i in run["datasetRunItems"]})
    for value, trace in zip([1.0, 0.5, 0.0, 0.5], traces, strict=False):
        rec.annotate(trace, REVIEW_SCORE, value)
    expected = sum([1.0, 0.5, 0.0, 0.5][: len(traces)]) / len(traces)
    assert run_score("arith-held-out", "agent@1", score=REVIEW_SCORE, config=cfg) == expected
    # no such run (yet: Langfuse's reads lag), no such score, no Langfuse: nothing to gate on
    assert run_score("arith-held-out", "agent@9", config=cfg) is None
    assert run_score("arith-held-out", "agent@1", score="nobody_sent_this", config=cfg) is None
    down = cfg.model_copy(update={"base_url": "http://127.0.0.1:9"})
    assert run_score("arith-held-out", "agent@1", config=down) is None


async def test_promotion_gates_on_the_langfuse_dataset_run(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path
) -> None:
    _, handle = receiver
    cfg = _config(handle)
    sft = [[{"role": "user", "content": "count"}, {"role": "assistant", "content": "one two"}]]
    async with art.LocalBackend(path=tmp_path) as backend:
        model = art.TrainableModel(
            name="agent",
            project="p",
            base_model="tiny",
            training=art.ModelConfig(promote_on_evaluation=True),
        )
        await model.register(backend)
        for _ in range(2):
            await model.train_sft(sft, art.TrainConfig(learning_rate=1e-3), epochs=1)
        log_evaluation("gate", "agent@1", _evaluated(1), config=cfg)  # mean reward 0.5625
        log_evaluation("gate", "agent@2", _evaluated(0), config=cfg)  # mean reward 0.125
        d1 = await promote_from_langfuse(model, "gate", 1, config=cfg)
        assert d1 is not None and d1.promoted and d1.served == 1 and d1.score == 0.5625
        d2 = await promote_from_langfuse(model, "gate", 2, config=cfg)
        assert d2 is not None and not d2.promoted and d2.served == 1 and d2.score == 0.125
        assert await promote_from_langfuse(model, "gate", 3, config=cfg) is None  # no run


def test_sending_an_evaluation_again_links_its_items_once(
    receiver: tuple[Receiver, ServerHandle],
) -> None:
    rec, handle = receiver
    pairs = _evaluated(1)
    for _ in range(2):  # as an export after a half-sent evaluation does
        assert log_evaluation("arith-held-out", "agent@1", pairs, config=_config(handle)).sent
    run = _get(handle, "api/public/datasets/arith-held-out/runs/agent@1")
    assert len(run["datasetRunItems"]) == len(rec.dataset_run_items) == 4


async def test_art_mcp_train_stops_on_a_clashing_dataset_before_any_rollout(
    receiver: tuple[Receiver, ServerHandle], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_mcp import HarnessConfig, train

    rec, handle = receiver
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-test")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-test")
    monkeypatch.setenv("LANGFUSE_BASE_URL", base_url(handle))
    monkeypatch.delenv("ART_LANGFUSE", raising=False)
    rec.add_dataset("mcp-agent-held-out", {"owner": "the support team"})
    cfg = HarnessConfig(path=str(tmp_path), base_model="tiny", name="agent", steps=1)
    with pytest.raises(DatasetClashError, match="mcp-agent-held-out"):
        await train(
            "python -m examples.mcp_server.server",
            cfg,
            scenarios=ROOT / "examples/mcp_server/scenarios.jsonl",
            reward="examples.mcp_server.tasks:score",
        )
    folder = tmp_path / "mcp" / "models" / "agent"
    assert not list(folder.glob("trajectories/*")) and not rec.traces  # nothing rolled out
