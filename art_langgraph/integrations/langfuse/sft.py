"""SFT files from reviews: approved trajectories and reviewers' corrections (extra `langfuse`).

Both write a JSONL of Trajectories, which `art.read_jsonl` reads and `model.train_sft`
trains on token-exactly.

Approved. `approved_sft_file(result, out)` keeps the trajectories whose (reviewed) reward
is at least `min_reward`, from an `import_scores` result (review.py) or groups.

Corrections. A reviewer's corrected output is a Langfuse score of data type CORRECTION
(named "output", its value the corrected text), on a generation or on the whole trace.
`corrections_sft_file(folder, out)` turns each into an SFT example: the trajectory up to
the corrected call (earlier calls kept untrainable, as context), then the correction as that
call's reply, trained alone; a trace-level correction corrects the last call.

Left out: reading the scores (review.py); deduplicating corrections of one call (each is
an example).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from art_langgraph.integrations.langfuse.config import LangfuseConfig
from art_langgraph.integrations.langfuse.folder import saved_groups
from art_langgraph.integrations.langfuse.review import ReviewedScore, ReviewResult, fetch_scores
from art_langgraph.integrations.langfuse.traces import span_id, trace_id_for
from art_langgraph.trajectories.trajectory import LLMCall, Trajectory, TrajectoryGroup, write_jsonl

log = logging.getLogger(__name__)


def approved_sft_file(
    result: ReviewResult | Iterable[TrajectoryGroup],
    out: str | Path,
    *,
    min_reward: float = 1.0,
) -> int:
    """Write the trajectories whose (reviewed) reward is at least `min_reward` as a JSONL of
    Trajectories, which `art.read_jsonl` reads and `model.train_sft` trains on token-exactly.
    Returns how many were written."""
    groups = result.groups if isinstance(result, ReviewResult) else list(result)
    approved = [t for g in groups for t in g.trajectories if t.reward >= min_reward]
    return write_jsonl(out, approved)


# ------------------------------------------------------------------ corrections
def _correction_message(value: str) -> dict[str, Any]:
    """The corrected reply: the message JSON Langfuse showed, edited; or plain text."""
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    if isinstance(parsed, dict) and ({"content", "tool_calls"} & parsed.keys()):
        msg = {k: v for k, v in parsed.items() if k in ("content", "tool_calls")}
        return {"role": "assistant", **msg}
    return {"role": "assistant", "content": parsed if isinstance(parsed, str) else value}


def _corrected_call(t: Trajectory, trace_id: str, observation_id: str | None) -> int | None:
    if not t.calls:
        return None
    if observation_id is None:
        return len(t.calls) - 1  # the trace's output: its last call's reply
    for i in range(len(t.calls)):
        if format(span_id(trace_id, f"call:{i}"), "016x") == observation_id:
            return i
    return None


def correction_examples(
    source: str | Path | list[TrajectoryGroup],
    *,
    queue_id: str | None = None,
    config: LangfuseConfig | None = None,
    scores: list[ReviewedScore] | None = None,
) -> list[Trajectory]:
    """One SFT example per correction of a trajectory of `source` (see the module doc);
    corrections of traces or generations not in `source` are skipped, with a log line."""
    if scores is None:
        scores = fetch_scores(source=None, queue_id=queue_id, data_type="CORRECTION", config=config)
    by_trace = {
        str(t.metadata.get("langfuse_trace_id") or trace_id_for(t)): t
        for g in (source if isinstance(source, list) else saved_groups(source))
        for t in g.trajectories
    }
    out: list[Trajectory] = []
    skipped = 0
    for s in sorted(scores, key=lambda s: s.id):
        t = by_trace.get(s.trace_id or "")
        i = None if t is None else _corrected_call(t, s.trace_id or "", s.observation_id)
        if t is None or i is None or s.data_type != "CORRECTION" or not isinstance(s.value, str):
            skipped += 1
            continue
        call = t.calls[i]
        reply = _correction_message(s.value)
        fixed = LLMCall(
            messages=call.messages,
            tools=call.tools,
            tool_choice=call.tool_choice,
            response_message=reply,
            model=call.model,
            node=call.node,
            namespace=call.namespace,
            metadata={"correction_of": call.id},
        )
        context = [c.model_copy(update={"trainable": False}) for c in t.calls[:i]]
        seen = {m.get("tool_call_id") for m in call.messages}
        out.append(
            Trajectory(
                messages=[*call.messages, reply],
                calls=[*context, fixed],
                tool_events=[e for e in t.tool_events if e.tool_call_id in seen],
                reward=1.0,
                metadata={
                    "corrected_trajectory_id": t.id,
                    "langfuse_trace_id": s.trace_id,
                    "correction_score_id": s.id,
                    "corrected_call": i,
                    **({"scenario": t.metadata["scenario"]} if "scenario" in t.metadata else {}),
                },
            )
        )
    if skipped:
        log.info("%d corrections name no trajectory or call of this source: skipped", skipped)
    return out


def corrections_sft_file(
    source: str | Path | list[TrajectoryGroup],
    out: str | Path,
    *,
    queue_id: str | None = None,
    config: LangfuseConfig | None = None,
    scores: list[ReviewedScore] | None = None,
) -> int:
    """Write the corrections as SFT examples (a JSONL of Trajectories, the format of
    `approved_sft_file`, for `model.train_sft`). Returns how many were written."""
    examples = correction_examples(source, queue_id=queue_id, config=config, scores=scores)
    return write_jsonl(out, examples)
