"""Weights & Biases logging, as OpenPipe ART does it (extra `wandb`).

`WandbLogger` is a `TrajectoryLogger` (art_langgraph/trajectories/loggers.py): pass it to a backend,
`LocalBackend(loggers=[WandbLogger()])`. One W&B run per model: named after the model,
in the model's project unless `project=` says otherwise, with a stable id (project and
name), so a resumed training continues the same run. Per step it logs:

- the step's metrics under `{split}/{name}` (train: loss, grad norm, KL, tokens/s...;
  other splits: their reward), with `training_step` as the x axis of every chart;
- the rewards of each batch of trajectories (`{split}/rollouts/reward_mean`, `_std`,
  `_min`, `_max`, `trajectories`, `exceptions`): the reward curve of every split, also
  from a `RemoteBackend` (whose metrics are the server's);
- a `trajectories` table: step, split, group, id, reward, RULER score, independent
  reward, turns, tool calls, tool errors, the last message, the exception; at most
  `table_rows_per_step` rows per batch.

`wandb` is imported at first use; `WANDB_MODE=offline` works as everywhere in W&B.

Left out: artifacts (checkpoints stay in the model's folder), W&B sweeps and alerts.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

from art_langgraph.trajectories.logger_protocol import RunInfo
from art_langgraph.trajectories.records import finite_numbers
from art_langgraph.trajectories.trajectory import Trajectory, TrajectoryGroup

_COLUMNS = [
    "step",
    "split",
    "group",
    "trajectory_id",
    "reward",
    "ruler_score",
    "independent_reward",
    "turns",
    "tool_calls",
    "tool_errors",
    "last_message",
    "exception",
]


def _wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise ImportError(
            "WandbLogger needs the wandb extra: pip install 'art-langgraph[wandb]'"
        ) from exc
    return wandb


def _row(step: int, split: str, group: int, t: Trajectory) -> list[Any]:
    last = t.messages[-1] if t.messages else {}
    text = last.get("content") if isinstance(last.get("content"), str) else json.dumps(last)
    return [
        step,
        split,
        group,
        t.id,
        t.reward,
        t.metrics.get("ruler_score"),
        t.metrics.get("independent_reward"),
        len(t.calls),
        sum(len(c.tool_calls) for c in t.calls),
        sum(1 for e in t.tool_events if e.error),
        (text or "")[:2000],
        f"{t.exception.type}: {t.exception.message}" if t.exception else None,
    ]


class WandbLogger:
    """Logs metrics, reward curves and a trajectory table to one W&B run per model."""

    def __init__(
        self,
        *,
        project: str | None = None,
        entity: str | None = None,
        mode: str | None = None,
        dir: str | Path | None = None,
        table_rows_per_step: int = 64,
        **init_kwargs: Any,
    ) -> None:
        """`project`: the W&B project (default: the model's). `mode`: "online", "offline"
        or "disabled" (default: `$WANDB_MODE`, else W&B's). `dir`: where W&B writes its
        files (default: the model's folder when the backend is local). Other keywords go
        to `wandb.init`."""
        self.project, self.entity, self.mode = project, entity, mode
        self.dir = Path(dir) if dir is not None else None
        self.table_rows_per_step = table_rows_per_step
        self.init_kwargs = init_kwargs
        self.runs: dict[tuple[str, str], Any] = {}

    @staticmethod
    def run_id(run: RunInfo) -> str:
        """The W&B run id of a model: stable, so a resumed training logs to the same run."""
        digest = hashlib.sha256(f"{run.project}/{run.name}".encode()).hexdigest()[:12]
        return f"{run.name[:40]}-{digest}"

    def _run(self, run: RunInfo) -> Any:
        key = (run.project, run.name)
        if key not in self.runs:
            wandb = _wandb()
            folder = self.dir or run.folder
            if folder is not None:
                Path(folder).mkdir(parents=True, exist_ok=True)
            r = wandb.init(
                project=self.project or run.project,
                entity=self.entity,
                name=run.name,
                id=self.run_id(run),
                resume="allow",
                mode=self.mode,
                dir=str(folder) if folder is not None else None,
                config={"base_model": run.base_model, "model": run.name, "project": run.project},
                reinit="create_new",
                **self.init_kwargs,
            )
            r.define_metric("training_step")
            r.define_metric("*", step_metric="training_step")
            self.runs[key] = r
        return self.runs[key]

    # the TrajectoryLogger protocol
    def log_metrics(self, run: RunInfo, step: int, split: str, metrics: dict[str, float]) -> None:
        data = {f"{split}/{k}": v for k, v in finite_numbers(metrics).items()}
        if data:
            self._run(run).log({**data, "training_step": step})

    def log_trajectories(
        self, run: RunInfo, step: int, split: str, groups: list[TrajectoryGroup]
    ) -> None:
        trajs = [(gi, t) for gi, g in enumerate(groups) for t in g.trajectories]
        if not trajs:
            return
        rewards = [t.reward for _, t in trajs]
        data: dict[str, Any] = {
            f"{split}/rollouts/reward_mean": statistics.fmean(rewards),
            f"{split}/rollouts/reward_std": statistics.pstdev(rewards),
            f"{split}/rollouts/reward_min": min(rewards),
            f"{split}/rollouts/reward_max": max(rewards),
            f"{split}/rollouts/trajectories": len(rewards),
            f"{split}/rollouts/exceptions": sum(len(g.exceptions) for g in groups),
            "training_step": step,
        }
        wandb = _wandb()
        rows = [_row(step, split, gi, t) for gi, t in trajs[: self.table_rows_per_step]]
        data["trajectories"] = wandb.Table(columns=_COLUMNS, data=rows)
        self._run(run).log(data)

    def close(self) -> None:
        """Finish this logger's runs and return once their records are on disk (offline) or
        handed to W&B's service for upload (online).

        `run.finish()` waits for the run's exit record, but the service writes the rest of
        the run's transaction log (the `.wandb` file) when it closes the run's stream, after
        `finish()` has returned. W&B's own wait for that is `wandb.teardown()`, which shuts
        the service down once every stream is closed and flushed. It also finishes any run
        still open in this process, so it is called only when no other run is active; with
        a run of the user's still open, the records reach disk when that run's process
        tears W&B down (at exit at the latest)."""
        runs = list(self.runs.values())
        self.runs.clear()
        for r in runs:
            r.finish()
        if runs:
            _teardown_if_idle()


def _teardown_if_idle() -> None:
    """`wandb.teardown()` (flush and stop the service) when no W&B run is active."""
    wandb = _wandb()
    from wandb.sdk import wandb_setup

    if wandb_setup.singleton().most_recent_active_run is None:
        wandb.teardown()
