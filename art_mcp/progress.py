"""What `art_mcp.train` shows while it runs: log lines, progress bars, a step's note.

`say` is the default log (stdout, flushed per line); progress bars draw only on a terminal
(`terminal`); `TrainingProgress` is the trainer's `progress` callback (trained tokens,
as a bar); `trained_note` says what a step trained on when it is not every group, or why
it trained on nothing; `warm_start_line` what the SFT warm start did and how long it took;
`EngineTally` says what an embedded engine computed over a phase (prompt tokens, the share
its prefix cache served, tokens generated); `peak_rss` this process's memory high-water
mark so far, so the phase that raised it is the one whose line it first grew on.

Left out: the report (report.py), which is rebuilt from the saved journal, not from these
lines.
"""

from __future__ import annotations

import sys
from typing import Any

from art_langgraph.engine.base import EngineMetrics


def say(line: str) -> None:
    """The default log: stdout, flushed line by line (a pipe or a file sees each line)."""
    print(line, flush=True)


def peak_rss() -> str:
    """ "; peak RSS 3.71 GiB": this process's resident-memory high-water mark since it started
    (an embedded engine and trainer included; the MCP server, a child, not), or "" where
    the platform does not say. It never falls, so the phase whose line it first grew on
    is the one that set it."""
    if sys.platform != "linux":  # macOS counts bytes; Windows has no `resource`
        return ""
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    if kib <= 0:
        return ""
    return f"; peak RSS {kib / 2**20:.2f} GiB"


def trained_note(m: dict[str, float], judge_params: dict[str, Any] | None) -> str:
    """What a step trained on, when it is not every group: "(2 of 8 groups had one reward
    for all their rollouts)", or why it trained on nothing."""
    groups = int(m.get("groups", 0))
    zv = int(m.get("zero_variance_groups", 0))
    if m.get("nothing_trainable"):
        if groups and zv == groups:
            who = "the judge" if judge_params is not None else "the reward function"
            why = f"in every group, {who} gave all rollouts the same score"
        elif m.get("stale_groups"):
            why = "its groups were sampled from adapters older than max_staleness allows"
        else:
            why = "no rollout had a trainable token (every group empty or without variance)"
        return f" - TRAINED ON NOTHING: {why}; the step advances with the adapter unchanged"
    if zv:
        return f" ({zv} of {groups} groups had one reward for all rollouts: not trained on)"
    return ""


def warm_start_line(
    demonstrations: int, epochs: int, m: dict[str, float], *, epoch: int | None = None
) -> str:
    """The log line of a warm start from `train_sft`'s metrics: "SFT warm start on 128
    demonstrations: 2 of 3 epochs in 240 s (stopped at loss 0.01), loss 0.58 -> 0.00;
    epochs' tail losses 0.04, 0.01; tail demonstrations with no token in doubt (p > 0.5)
    0.62, 0.94"; with `epoch`, of that one epoch of `epochs`: "SFT warm start on 120
    demonstrations: epoch 2 of 3 in 120 s, loss 0.02 -> 0.00; tail loss 0.00; ..."."""
    ran = int(m.get("sft_epochs", epochs))
    tails = ", ".join(f"{m[f'sft_epoch{k}_tail_loss']:.2f}" for k in range(1, ran + 1))
    sure = [m.get(f"sft_epoch{k}_tail_sure") for k in range(1, ran + 1)]
    shares = ", ".join(f"{x:.2f}" for x in sure if x is not None)
    if epoch is None:
        stopped = f" (stopped at loss {m[f'sft_epoch{ran}_tail_loss']:.2f})" if ran < epochs else ""
        what, tail = f"{ran} of {epochs} epochs", f"epochs' tail losses {tails}"
    else:
        stopped, what, tail = "", f"epoch {epoch} of {epochs}", f"tail loss {tails}"
    return (
        f"SFT warm start on {demonstrations} demonstrations: {what} in "
        f"{m.get('sft_seconds', 0):.0f} s{stopped}, loss {m['sft_loss_first']:.2f} -> "
        f"{m['sft_loss_last']:.2f}; {tail}"
        + (f"; tail demonstrations with no token in doubt (p > 0.5) {shares}" if shares else "")
    )


def terminal() -> bool:
    """Whether progress bars can draw: stderr is a terminal."""
    return sys.stderr.isatty()


class TrainingProgress:
    """The trainer's `progress` callback (called from its thread): trained tokens so far,
    as a bar on a terminal; the totals for the line after the step."""

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.micro_batches = self.tokens = 0
        self.bar: Any = None

    def __enter__(self) -> TrainingProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()

    def __call__(self, stage: str, info: dict[str, Any]) -> None:
        if stage != "micro_batch":
            return
        self.micro_batches += 1
        self.tokens += int(info.get("tokens", 0))
        if terminal():
            if self.bar is None:
                from tqdm.auto import tqdm

                total = int(info.get("total_tokens", 0)) or None
                self.bar = tqdm(total=total, desc=self.desc, unit="tok", dynamic_ncols=True)
            self.bar.update(int(info.get("tokens", 0)))


class EngineTally:
    """What an embedded backend's engine did between `start` and `note`: the prompt tokens
    it admitted, the share of them its prefix cache served, and the tokens it generated.
    An agent's later turns extend its earlier prompts, so a low share means the cache was
    too small for the episodes in flight (their KV evicted before their next turn came).
    Says nothing for a backend without an engine in this process (a remote one)."""

    def __init__(self, backend: Any) -> None:
        self._engine = getattr(backend, "engine", None)
        self._start = self._read()

    def _read(self) -> EngineMetrics | None:
        metrics = getattr(self._engine, "metrics", None)
        return metrics() if metrics is not None else None

    def start(self) -> None:
        self._start = self._read()

    def note(self) -> str:
        """ "; engine: 812k prompt tokens (61% from its prefix cache), 52k generated", or ""."""
        end, start = self._read(), self._start
        if end is None or start is None:
            return ""
        prompt = end.prompt_tokens - start.prompt_tokens
        queried = end.prefix_cache_queries - start.prefix_cache_queries
        hits = end.prefix_cache_hits - start.prefix_cache_hits
        made = end.generation_tokens - start.generation_tokens
        cache = f" ({hits / queried:.0%} from its prefix cache)" if queried else ""
        return f"; engine: {_k(prompt)} prompt tokens{cache}, {_k(made)} generated"


def _k(n: int) -> str:
    return f"{n / 1000:.0f}k" if n >= 10_000 else str(n)
