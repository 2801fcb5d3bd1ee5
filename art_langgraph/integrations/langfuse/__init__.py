"""Langfuse for art_langgraph: rollouts out as traces, reviews back as rewards (extra `langfuse`).

Export (rollouts out):

    config.py      `LangfuseConfig`: which Langfuse, resolved from its environment variables
    traces.py      a trajectory as a trace: OpenTelemetry spans, score bodies, stable ids
    sender.py      `Sender`: one connection (OTLP spans, the SDK's API client, score configs)
    export.py      `LangfuseLogger` (a backend's logger, background queue) and
                   `export_folder` (re-send what did not get through)
    folder.py      what the package reads and writes in a model's folder
    scoring.py     the score configs every score we send names
    datasets.py    held-out evaluations as dataset runs

Review (reviews back):

    annotation.py  a sample of rollouts sent to an annotation queue for human review
    review.py      review scores read back: as rewards (`import_scores`), against the
                   judge (`calibrate`)
    sft.py         SFT files from reviews: approved trajectories, reviewers' corrections

Why these names: each module is named for the one thing it holds, in Langfuse's own
words where Langfuse has one (traces, scoring, datasets, annotation queues), so a reader
who knows Langfuse finds each part under the feature's name. The queue module is
`annotation`, not `queue`: that reads as the standard library's module, and export.py
has a queue of its own (its batches waiting to be sent). The package keeps the old
module's name, so `from art_langgraph.integrations.langfuse import LangfuseLogger` and the
other names of its `__all__` work as before, without a warning.

Until 0.2 the old flat modules still import, with a DeprecationWarning:
`integrations.langfuse_datasets` (now datasets.py), `integrations.langfuse_review`
(annotation.py, with `calibrate` in review.py and the corrections in sft.py) and
`integrations.langfuse_scoring` (scoring.py). So do the old module's other public names
here (`fetch_scores`, `ReviewedScore`, `score_bodies`, `EXPORTS_FILE`, `OTLP_PATH`,
`SCOPE`): import them from their module.

Left out: prompts and experiments; media uploads; sessions beyond one per
(model, split, step).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from art_langgraph.integrations.langfuse.config import LangfuseConfig
from art_langgraph.integrations.langfuse.export import ExportReport, LangfuseLogger, export_folder
from art_langgraph.integrations.langfuse.review import ReviewResult, import_scores
from art_langgraph.integrations.langfuse.sft import approved_sft_file
from art_langgraph.integrations.langfuse.traces import trace_id_for

__all__ = [
    "ExportReport",
    "LangfuseConfig",
    "LangfuseLogger",
    "ReviewResult",
    "approved_sft_file",
    "export_folder",
    "import_scores",
    "trace_id_for",
]

_MOVED = {
    "EXPORTS_FILE": "folder",
    "OTLP_PATH": "sender",
    "SCOPE": "traces",
    "ReviewedScore": "review",
    "fetch_scores": "review",
    "score_bodies": "traces",
}
"""Public names of the old single module that are not in `__all__`: name -> new module."""


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = f"{__name__}.{_MOVED[name]}"
    warnings.warn(
        f"{__name__}.{name} moved to {home}; the old path goes in 0.2",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)
