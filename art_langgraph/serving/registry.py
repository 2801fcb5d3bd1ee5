"""Which model names the server answers to, and which adapter serves each step.

A served name maps steps to engine adapters: the base model is step 0 of its own name
(and of any trainable model that has not trained yet). A request names `name` (the
latest step), `name@step` (pinned) or `name@latest`; the response's `model` field is
always `name@step`, so a caller can tell which weights answered. With promotion on for
a name (`set_promotion`, `promotion.py`), `name` serves the promoted step instead and
`name@latest` the latest; only requests for the latest wait while a step trains.

Left out: persistence (checkpoints on disk are the trainer's business; the promoted step
is read through the callable `set_promotion` was given).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass

from art_langgraph.errors import UnknownModelError, UsageError
from art_langgraph.runtime.names import LATEST, inference_name, parse_inference_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """The answer to "who serves this model string"."""

    name: str
    step: int
    adapter: str | None
    """Engine adapter name; None for the base model."""
    path: str | None = None
    """Where the adapter lives on disk, so a server can load it on demand."""

    @property
    def label(self) -> str:
        return inference_name(self.name, self.step)


class ModelRegistry:
    """Thread-safe map of served names to {step: adapter}."""

    def __init__(self, base_name: str) -> None:
        self.base_name = base_name
        self._steps: dict[str, dict[int, tuple[str | None, str | None]]] = {
            base_name: {0: (None, None)}
        }
        self._paused: set[str] = set()
        self._promoted: dict[str, Callable[[], int | None]] = {}
        self._missing: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def add_model(self, name: str) -> None:
        """Serve `name` at step 0 with the base weights (a model that has not trained yet)."""
        _check_name(name)
        with self._lock:
            self._steps.setdefault(name, {0: (None, None)})

    def set_step(self, name: str, step: int, adapter: str | None, path: str | None = None) -> None:
        """Serve `name@step` with the engine adapter `adapter` (loadable from `path`); newest is latest."""
        _check_name(name)
        if step < 0:
            raise UsageError(f"step must be >= 0, got {step}")
        with self._lock:
            self._steps.setdefault(name, {})[step] = (adapter, path)

    def pause(self, name: str) -> None:
        """Requests for `name` (latest) wait until `resume(name)`; pinned steps are served."""
        with self._lock:
            self._paused.add(name)

    def resume(self, name: str) -> None:
        with self._lock:
            self._paused.discard(name)

    def set_promotion(self, name: str, promoted: Callable[[], int | None] | None) -> None:
        """Serve `name` by the step `promoted()` returns (called at each request: keep it
        cheap; None from it: the latest); `promoted=None`: the latest step, as by default."""
        with self._lock:
            if promoted is None:
                self._promoted.pop(name, None)
            else:
                self._promoted[name] = promoted

    def is_paused(self, model: str) -> bool:
        """True while a request for `model` must wait: it names a paused model's latest step
        (`name` without promotion, or `name@latest`)."""
        name, step = parse_inference_name(model)
        if step is not None:
            return step == LATEST and name in self._paused
        return name in self._paused and name not in self._promoted

    def drop_step(self, name: str, step: int) -> None:
        with self._lock:
            self._steps.get(name, {}).pop(step, None)

    def resolve(self, model: str) -> Served:
        """`name` -> the latest (or promoted) step; `name@latest` -> the latest step;
        `name@step` -> that step. Raises UnknownModelError."""
        name, asked = parse_inference_name(model)
        with self._lock:
            promoted = self._promoted.get(name) if asked is None else None
        chosen = promoted() if promoted is not None else None  # a file stat: outside the lock
        with self._lock:
            steps = self._steps.get(name)
            if not steps:
                raise UnknownModelError(model, self._labels())
            if chosen is not None:
                step = self._promoted_step(name, chosen, steps)
            elif asked is None or asked == LATEST:
                step = max(steps)
            elif isinstance(asked, int) and asked in steps:
                step = asked
            else:
                raise UnknownModelError(model, self._labels())
            adapter, path = steps[step]
            return Served(name, step, adapter, path)

    def _promoted_step(self, name: str, chosen: int, steps: Collection[int]) -> int:
        """`chosen`, or (its checkpoint gone) the newest served step before it."""
        if chosen in steps:
            return chosen
        older = [s for s in steps if s < chosen]
        step = max(older) if older else max(steps)
        if (name, chosen) not in self._missing:
            self._missing.add((name, chosen))
            log.warning(
                "%s: the promoted step %d is not served; serving step %d", name, chosen, step
            )
        return step

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._steps)

    def labels(self) -> list[str]:
        with self._lock:
            return self._labels()

    def _labels(self) -> list[str]:
        return [
            inference_name(n, s) for n, steps in sorted(self._steps.items()) for s in sorted(steps)
        ]


def _check_name(name: str) -> None:
    if not name or "@" in name or name != name.strip() or not name.isprintable():
        raise UsageError(
            f"invalid model name {name!r}: it must be non-empty, printable, hold no '@' and "
            "no leading or trailing whitespace"
        )
