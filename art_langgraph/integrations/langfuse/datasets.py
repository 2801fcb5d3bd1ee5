"""Held-out evaluations as Langfuse dataset runs (extra `langfuse`).

The held-out scenarios become the items of a Langfuse dataset, and each held-out
evaluation of a checkpoint becomes one dataset run, `name@step`, so Langfuse's dataset
view compares checkpoints item by item:

    dataset  <name>             created if missing, metadata {"art_langgraph": "held_out"}
      item   one per scenario   id: `item_id(dataset, scenario id)` (stable, so items are
                                upserted, never duplicated); input, expectedOutput,
                                metadata, sourceTraceId when the scenario came from a trace
    run      <model>@<step>     one run item per evaluated trajectory, linking its trace
                                (`trace_id_for`, the trace the exporter sends it to)
      scores per trace          reward (and RULER's pair), success; each with its configId
      scores per run            reward (mean over the run's trajectories) and success_rate,
                                as dataset-run scores (`datasetRunId`, which Langfuse's
                                score create body takes); the run's metadata repeats them

A training loop of your own logs an evaluation with

    from art_langgraph.integrations.langfuse.datasets import log_evaluation

    log_evaluation(
        dataset="my-agent-heldout",
        run_name=f"{model.name}@{await model.get_step()}",
        items=[(scenario, trajectory), ...],   # scenario: a pydantic model or dict with an "id"
        success_reward=1.0,                    # success: reward >= this
        folder=model_folder,                   # where unsent evaluations are recorded
    )

after `model.log(...)` has exported the trajectories as traces (the `LangfuseLogger`);
`art-mcp train` does it by itself at every held-out evaluation when `LANGFUSE_PUBLIC_KEY`
and `LANGFUSE_SECRET_KEY` are set.

Requests. Datasets, items and scores go through the SDK's API client; run items and run
listing are plain JSON requests to `POST /api/public/dataset-run-items` and `GET
/api/public/datasets/{name}/runs`, because SDK 5 dropped those from its client (it links
experiment items through span attributes instead), while the server still serves them.

Fail-soft. `log_evaluation` never raises for a Langfuse that is down, slow or answers an
error: it stops at the first failed request, logs a warning, and appends the whole
evaluation to `langfuse_evaluations.jsonl` in `folder`; `art-langgraph langfuse export
MODEL_DIR` (`resend_evaluations`) sends what is recorded as unsent. Re-sending is
idempotent: items and scores have stable ids, and a run's items already linked are not
linked again.

Clashes raise (`DatasetClashError`, `ScoreConfigClashError`): a dataset of the same name
without our metadata marker, or a score config of the same name that would reject our
scores. The evaluation is still recorded, so it can be sent once the clash is resolved.

The gate that promotes a checkpoint on its run's Langfuse scores is `gate.py`.

Left out: dataset versions, item status (archiving items no longer held out), observation-
level run items, and deleting runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field

from art_langgraph.errors import UsageError
from art_langgraph.integrations.langfuse.client import NO_RETRY
from art_langgraph.integrations.langfuse.config import EXTRA_MISSING, LangfuseConfig
from art_langgraph.integrations.langfuse.folder import append_stamped, latest_unsent
from art_langgraph.integrations.langfuse.scoring import (
    REWARD,
    SUCCESS,
    SUCCESS_RATE,
    ScoreConfigClashError,
)
from art_langgraph.integrations.langfuse.sender import Sender
from art_langgraph.integrations.langfuse.traces import score_bodies, trace_id_for
from art_langgraph.trajectories.records import read_records
from art_langgraph.trajectories.trajectory import Trajectory

try:
    from langfuse.api import NotFoundError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(EXTRA_MISSING) from exc

log = logging.getLogger(__name__)

EVALUATIONS_FILE = "langfuse_evaluations.jsonl"
DATASET_MARKER = {"art_langgraph": "held_out"}
"""Metadata of the datasets this module creates; a dataset without it is someone else's."""
RUN_ITEMS_PATH = "api/public/dataset-run-items"


class DatasetClashError(UsageError):
    """A Langfuse dataset of the same name exists and was not made for held-out evaluations."""

    def __init__(self, name: str, metadata: Any) -> None:
        self.name = name
        self.metadata = metadata
        super().__init__(
            f"Langfuse dataset {name!r} already exists and is not an art_langgraph held-out "
            f"dataset (its metadata {metadata!r} lacks {DATASET_MARKER!r}); pick another "
            "dataset name, or add that key to the dataset's metadata to reuse it"
        )


class EvalItem(BaseModel):
    """One evaluated trajectory and the dataset item (scenario) it ran."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    item_id: str
    """The dataset item's id: `item_id(dataset, scenario id)`."""
    input: Any = None
    """The item's input (the scenario's `input`, else its `task`, else the scenario)."""
    expected_output: Any = None
    """The item's expected output (the scenario's `expected_output`, else `answer`)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """The item's metadata: the scenario's id and its other fields."""
    source_trace_id: str | None = None
    """The trace the scenario came from, when it did (its `source_trace_id`)."""
    trace_id: str
    """The evaluated trajectory's trace."""
    trajectory_id: str
    """The evaluated trajectory's id."""
    reward: float
    """Its reward."""
    success: bool
    """reward >= the run's success threshold."""
    scores: list[dict[str, Any]] = Field(default_factory=list)
    """Its trace's scores (`score_bodies`, plus success), without config ids yet."""


class EvaluationRun(BaseModel):
    """Everything one held-out evaluation sends: what is recorded when it was not sent."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    dataset: str
    """The dataset's name."""
    dataset_description: str | None = None
    """Description given to the dataset when it is created."""
    run_name: str
    """The dataset run's name, `model@step`."""
    run_description: str | None = None
    """The run's description."""
    run_metadata: dict[str, Any] = Field(default_factory=dict)
    """The run's metadata (step, model, aggregates)."""
    aggregates: dict[str, float] = Field(default_factory=dict)
    """Run-level scores by config name: reward (mean) and success_rate."""
    environment: str | None = None
    """Langfuse environment of the scores."""
    items: list[EvalItem]
    """One per evaluated trajectory (several may share a dataset item)."""


class EvaluationLog(BaseModel):
    """What `log_evaluation` did."""

    sent: bool
    """The whole evaluation got through."""
    run_id: str | None = None
    """The dataset run's id (from the server), when sent."""
    items: int = 0
    """Dataset items upserted."""
    run_items: int = 0
    """Run items created (trajectories linked)."""
    scores: int = 0
    """Scores sent (per trace and per run)."""
    error: str | None = None
    """Why it was not sent."""


# ------------------------------------------------------------------ building
def item_id(dataset: str, scenario_id: str) -> str:
    """The stable dataset item id of a scenario (Langfuse item ids are unique per project,
    so the dataset's name is part of it)."""
    digest = hashlib.sha256(f"{dataset}\x00{scenario_id}".encode()).hexdigest()[:32]
    return f"art-{digest}"


def _scenario_fields(scenario: Any) -> dict[str, Any]:
    if isinstance(scenario, BaseModel):
        d = scenario.model_dump(mode="json")
    elif isinstance(scenario, Mapping):
        d = json.loads(json.dumps(dict(scenario), default=str))
    else:
        raise UsageError(
            f"a scenario must be a pydantic model or a dict, not {type(scenario).__name__}"
        )
    return {k: v for k, v in d.items() if v is not None}


def _item_fields(dataset: str, scenario: Any) -> dict[str, Any]:
    d = _scenario_fields(scenario)
    sid = d.pop("id", None)
    if sid is None:
        sid = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    meta = d.get("metadata")
    inner: dict[str, Any] = meta if isinstance(meta, dict) else {}
    source = d.pop("source_trace_id", None) or inner.get("source_trace_id")
    if "input" in d:
        input_ = d.pop("input")
    elif "task" in d:
        input_ = d.pop("task")
    else:
        input_, d = d, {}
    expected = d.pop("expected_output", d.pop("answer", None))
    return {
        "item_id": item_id(dataset, str(sid)),
        "input": input_,
        "expected_output": expected,
        "metadata": {"scenario_id": str(sid), **d},
        "source_trace_id": source if isinstance(source, str) else None,
    }


def evaluation_run(
    dataset: str,
    run_name: str,
    items: Iterable[tuple[Any, Trajectory]],
    *,
    success_reward: float = 1.0,
    metadata: dict[str, Any] | None = None,
    description: str | None = None,
    dataset_description: str | None = None,
    environment: str | None = None,
) -> EvaluationRun:
    """What `log_evaluation` sends, built from (scenario, trajectory) pairs."""
    out: list[EvalItem] = []
    for scenario, t in items:
        trace_id = trace_id_for(t)
        success = t.reward >= success_reward
        scores = score_bodies(t, environment)
        scores.append(
            {
                "id": f"{trace_id}-{SUCCESS}",
                "traceId": trace_id,
                "name": SUCCESS,
                "value": 1.0 if success else 0.0,
                "dataType": "BOOLEAN",
                "metadata": {"source": "art_langgraph", "trajectory_id": t.id},
                **({"environment": environment} if environment else {}),
            }
        )
        out.append(
            EvalItem(
                **_item_fields(dataset, scenario),
                trace_id=trace_id,
                trajectory_id=t.id,
                reward=t.reward,
                success=success,
                scores=scores,
            )
        )
    if not out:
        raise UsageError("log_evaluation needs at least one (scenario, trajectory) pair")
    rewards = [i.reward for i in out if math.isfinite(i.reward)]
    aggregates = {
        REWARD: sum(rewards) / len(rewards) if rewards else float("nan"),
        SUCCESS_RATE: sum(i.success for i in out) / len(out),
    }
    aggregates = {k: v for k, v in aggregates.items() if math.isfinite(v)}
    run_metadata = {
        **(metadata or {}),
        "source": "art_langgraph",
        "trajectories": len(out),
        "items": len({i.item_id for i in out}),
        "success_reward": success_reward,
        **{f"mean_{k}" if k == REWARD else k: v for k, v in aggregates.items()},
    }
    return EvaluationRun(
        dataset=dataset,
        dataset_description=dataset_description,
        run_name=run_name,
        run_description=description,
        run_metadata=run_metadata,
        aggregates=aggregates,
        environment=environment,
        items=out,
    )


# ------------------------------------------------------------------ sending
def _ensure_dataset(sender: Sender, run: EvaluationRun) -> None:
    try:
        ds = sender.api.datasets.get(dataset_name=run.dataset, request_options=NO_RETRY)
    except NotFoundError:
        sender.api.datasets.create(
            name=run.dataset,
            description=run.dataset_description
            or "Held-out scenarios of an art_langgraph model; one run per evaluated checkpoint.",
            metadata=dict(DATASET_MARKER),
            request_options=NO_RETRY,
        )
        return
    _check_ours(run.dataset, ds.metadata)


def _check_ours(dataset: str, metadata: Any) -> None:
    meta = metadata if isinstance(metadata, dict) else {}
    if any(meta.get(k) != v for k, v in DATASET_MARKER.items()):
        raise DatasetClashError(dataset, metadata)


def check_dataset(dataset: str, *, config: LangfuseConfig | None = None) -> None:
    """Check, before a run starts, that `dataset` is ours or free: raises
    `DatasetClashError` for a dataset of that name without our marker (someone else's),
    and `UsageError` without keys; a Langfuse that cannot be reached is a warning (the
    evaluations are then recorded and sent later)."""
    sender = Sender((config or LangfuseConfig()).resolved())
    try:
        ds = sender.api.datasets.get(dataset_name=dataset, request_options=NO_RETRY)
    except NotFoundError:
        return
    except Exception as exc:
        log.warning(
            "Langfuse dataset %r could not be checked (%s: %s); evaluations not sent are "
            "recorded and sent later",
            dataset,
            type(exc).__name__,
            exc,
        )
        return
    finally:
        sender.close()
    _check_ours(dataset, ds.metadata)


def _post_json(sender: Sender, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = sender.request("POST", path, json=body)
    if r.status_code >= 300:
        raise RuntimeError(f"POST /{path} answered {r.status_code}: {r.text[:200]}")
    out = r.json()
    return out if isinstance(out, dict) else {}


def send_evaluation(run: EvaluationRun, sender: Sender) -> EvaluationLog:
    """Send one evaluation: score configs, dataset, items, run items, scores. Raises on
    the first failure (the caller records it); see `log_evaluation` for the fail-soft call."""
    ids = sender.config_ids()
    _ensure_dataset(sender, run)
    seen: set[str] = set()
    for it in run.items:
        if it.item_id in seen:
            continue
        seen.add(it.item_id)
        sender.api.dataset_items.create(
            dataset_name=run.dataset,
            id=it.item_id,
            input=it.input,
            expected_output=it.expected_output,
            metadata=it.metadata,
            request_options=NO_RETRY,
            **({"source_trace_id": it.source_trace_id} if it.source_trace_id else {}),
        )
    # A re-send (export after a partial failure) links only what is not linked yet.
    path = f"api/public/datasets/{quote(run.dataset, safe='')}/runs/{quote(run.run_name, safe='')}"
    existing = sender.get_json(path) or {}
    run_id: str | None = existing.get("id")
    linked = {
        (i.get("datasetItemId"), i.get("traceId")) for i in existing.get("datasetRunItems") or []
    }
    for it in run.items:
        if (it.item_id, it.trace_id) in linked:
            continue
        body: dict[str, Any] = {
            "runName": run.run_name,
            "metadata": run.run_metadata,
            "datasetItemId": it.item_id,
            "traceId": it.trace_id,
        }
        if run.run_description:
            body["runDescription"] = run.run_description
        created = _post_json(sender, RUN_ITEMS_PATH, body)
        run_id = run_id or created.get("datasetRunId")
    scores = [
        {**s, "configId": ids[s["name"]]} if s["name"] in ids else s
        for it in run.items
        for s in it.scores
    ]
    if run_id:
        for name, value in run.aggregates.items():
            body = {
                "id": f"{run_id}-{name}",
                "datasetRunId": run_id,
                "name": name,
                "value": value,
                "dataType": "NUMERIC",
                "metadata": {"source": "art_langgraph", "run_name": run.run_name},
            }
            if name in ids:
                body["configId"] = ids[name]
            if run.environment:
                body["environment"] = run.environment
            scores.append(body)
    sender.send_scores(scores)
    return EvaluationLog(
        sent=True, run_id=run_id, items=len(seen), run_items=len(run.items), scores=len(scores)
    )


# ------------------------------------------------------------------ records
def _record(folder: Path | None, line: dict[str, Any]) -> None:
    if folder is not None:
        append_stamped(folder / EVALUATIONS_FILE, [line])


def last_run_id(folder: str | Path) -> str | None:
    """The dataset run id of the last evaluation sent from this model folder; None if none."""
    for record in reversed(read_records(Path(folder) / EVALUATIONS_FILE, missing_ok=True)):
        if record.get("status") == "sent" and record.get("run_id"):
            return str(record["run_id"])
    return None


def _send_and_record(run: EvaluationRun, sender: Sender, folder: Path | None) -> EvaluationLog:
    key = {"dataset": run.dataset, "run_name": run.run_name}
    try:
        res = send_evaluation(run, sender)
    except (DatasetClashError, ScoreConfigClashError) as exc:
        _record(folder, {**key, "status": "unsent", "error": str(exc), "run": run.model_dump()})
        raise
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"
        _record(folder, {**key, "status": "unsent", "error": err, "run": run.model_dump()})
        return EvaluationLog(sent=False, error=err)
    _record(folder, {**key, "status": "sent", "run_id": res.run_id, "run_items": res.run_items})
    return res


def log_evaluation(
    dataset: str,
    run_name: str,
    items: Iterable[tuple[Any, Trajectory]],
    *,
    success_reward: float = 1.0,
    metadata: dict[str, Any] | None = None,
    description: str | None = None,
    folder: str | Path | None = None,
    config: LangfuseConfig | None = None,
) -> EvaluationLog:
    """Log one held-out evaluation as the dataset run `run_name` of `dataset`.

    `items`: (scenario, trajectory) pairs, several trajectories per scenario allowed; a
    scenario is a pydantic model or a dict with an `id` (its item id derives from it),
    `input` or `task`, `expected_output` or `answer`, and optionally `source_trace_id`.
    `success_reward`: a trajectory succeeds when its reward is at least this. `metadata`:
    added to the run's metadata (e.g. the step). `folder`: the model's folder, where an
    evaluation that did not get through is recorded for `art-langgraph langfuse export`.
    `config`: where to send (default: the `LANGFUSE_*` variables).

    Never raises for a server that is down or errs (returns `sent=False` and records it);
    raises `DatasetClashError` / `ScoreConfigClashError` for a name clash, and
    `UsageError` for bad arguments or missing keys."""
    cfg = (config or LangfuseConfig()).resolved()
    run = evaluation_run(
        dataset,
        run_name,
        items,
        success_reward=success_reward,
        metadata=metadata,
        description=description,
        environment=cfg.environment,
    )
    target = Path(folder) if folder is not None else None
    sender = Sender(cfg)
    try:
        res = _send_and_record(run, sender, target)
    finally:
        sender.close()
    if not res.sent:
        where = f"; re-send with `art-langgraph langfuse export {target}`" if target else ""
        log.warning(
            "Langfuse: evaluation %s of dataset %s not sent (%s)%s",
            run_name,
            dataset,
            res.error,
            where,
        )
    return res


def _unsent(folder: Path) -> list[EvaluationRun]:
    unsent = latest_unsent(
        folder / EVALUATIONS_FILE, lambda r: (str(r["dataset"]), str(r["run_name"]))
    )
    return [EvaluationRun.model_validate(rec["run"]) for rec in unsent if "run" in rec]


def resend_evaluations(folder: str | Path, sender: Sender) -> tuple[int, list[str]]:
    """Send the evaluations `folder`'s `langfuse_evaluations.jsonl` records as unsent.
    Returns (sent, names of those still not sent)."""
    target = Path(folder)
    sent, failed = 0, []
    for run in _unsent(target):
        try:
            res = _send_and_record(run, sender, target)
        except (DatasetClashError, ScoreConfigClashError) as exc:
            log.warning("Langfuse: evaluation %s not sent: %s", run.run_name, exc)
            failed.append(run.run_name)
            continue
        if res.sent:
            sent += 1
        else:
            log.warning("Langfuse: evaluation %s not sent: %s", run.run_name, res.error)
            failed.append(run.run_name)
    return sent, failed
