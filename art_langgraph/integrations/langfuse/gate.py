"""The gate: promote a checkpoint on what Langfuse says about its held-out run (extra
`langfuse`).

`run_score(dataset, run_name)` reads a dataset run's aggregate back from
Langfuse: the run's own score of that name (the one `log_evaluation` sends, or one a
Langfuse evaluator or a person put on the run), else the mean of that score over the
traces the run's items link. `promote_from_langfuse(model, dataset, step)` hands it to
`model.record_evaluation`, so a checkpoint is promoted on what Langfuse says about its
run. Langfuse's read APIs can lag about 10 minutes: a run not there yet reads as None.

Left out: sending the runs (`datasets.py`) and the promotion rule itself
(`backend/promotion.py`, behind `model.record_evaluation`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any
from urllib.parse import quote

from art_langgraph.integrations.langfuse.config import LangfuseConfig
from art_langgraph.integrations.langfuse.scoring import REWARD
from art_langgraph.integrations.langfuse.sender import Sender
from art_langgraph.runtime.names import inference_name

log = logging.getLogger(__name__)

SCORES_PATH = "api/public/v3/scores"


def _numeric_scores(sender: Sender, params: dict[str, str]) -> list[float]:
    """The numeric values of the scores `GET /api/public/v3/scores` lists for `params`."""
    out: list[float] = []
    cursor: str | None = None
    while True:
        page = sender.get_json(
            SCORES_PATH,
            {**params, "limit": "100", **({"cursor": cursor} if cursor else {})},
        )
        rows = (page or {}).get("data") or []
        for row in rows:
            value = row.get("value")
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                out.append(float(value))
        cursor = ((page or {}).get("meta") or {}).get("cursor")
        if not cursor or not rows:
            return out


def run_score(
    dataset: str,
    run_name: str,
    *,
    score: str = REWARD,
    config: LangfuseConfig | None = None,
) -> float | None:
    """A dataset run's aggregate of the score `score`, read from Langfuse.

    The run's own score of that name (a dataset-run score, `experimentId` in the scores
    API) when it has one, else the mean of the numeric scores of that name on the traces
    its run items link. None when the run, or every such score, is not in Langfuse (yet),
    or when Langfuse cannot be reached (logged): the gate then has no score to act on.
    Raises `UsageError` for missing keys."""
    cfg = (config or LangfuseConfig()).resolved()
    sender = Sender(cfg)
    try:
        path = f"api/public/datasets/{quote(dataset, safe='')}/runs/{quote(run_name, safe='')}"
        run = sender.get_json(path)
        if not run:
            return None
        own = _numeric_scores(sender, {"name": score, "experimentId": str(run["id"])})
        if own:
            return own[-1]
        traces = sorted(
            {i["traceId"] for i in run.get("datasetRunItems") or [] if i.get("traceId")}
        )
        values = [v for t in traces for v in _numeric_scores(sender, {"name": score, "traceId": t})]
        return sum(values) / len(values) if values else None
    except Exception as exc:  # a Langfuse down, slow or erring must not stop training
        log.warning("Langfuse: could not read run %s of dataset %s: %r", run_name, dataset, exc)
        return None
    finally:
        sender.close()


async def promote_from_langfuse(
    model: Any,
    dataset: str,
    step: int,
    *,
    score: str = REWARD,
    config: LangfuseConfig | None = None,
) -> Any:
    """Gate `model`'s checkpoint `step` on its Langfuse dataset run `{model.name}@{step}`:
    the run's aggregate (`run_score`) goes to `model.record_evaluation(step, value)`, whose
    rule promotes it or not (the model must have `promote_on_evaluation` on). Returns the
    `PromotionDecision`, or None when Langfuse has no score for that run (yet)."""
    value = await asyncio.to_thread(
        run_score, dataset, inference_name(model.name, step), score=score, config=config
    )
    if value is None:
        return None
    return await model.record_evaluation(step, value)
