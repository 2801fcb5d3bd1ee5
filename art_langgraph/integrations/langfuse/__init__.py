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
    gate.py        promote a checkpoint on its run's Langfuse scores

Review (reviews back):

    annotation.py  a sample of rollouts sent to an annotation queue for human review
    review.py      review scores read back: as rewards (`import_scores`), against the
                   judge (`calibrate`)
    sft.py         SFT files from reviews: approved trajectories, reviewers' corrections
    late_rewards.py  `langfuse_fetcher`: review scores as the rewards a wait is waiting for

Why these names: each module is named for the one thing it holds, in Langfuse's own
words where Langfuse has one (traces, scoring, datasets, annotation queues), so a reader
who knows Langfuse finds each part under the feature's name. The queue module is
`annotation`, not `queue`: that reads as the standard library's module, and export.py
has a queue of its own (its batches waiting to be sent). Import the names below from the
package (`from art_langgraph.integrations.langfuse import LangfuseLogger`).

Left out: prompts and experiments; media uploads; sessions beyond one per
(model, split, step).
"""

from __future__ import annotations

from art_langgraph.integrations.langfuse.config import LangfuseConfig
from art_langgraph.integrations.langfuse.export import ExportReport, LangfuseLogger, export_folder
from art_langgraph.integrations.langfuse.late_rewards import langfuse_fetcher
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
    "langfuse_fetcher",
    "trace_id_for",
]
