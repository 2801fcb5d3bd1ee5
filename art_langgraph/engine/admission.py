"""The torch engine's inbox and admission: which queued requests join the running batch at a step.

Requests, and commands (a function to run on the worker thread between two steps: an
adapter load or unload), arrive from any thread in one queue. At each step the worker
takes what joins (`Inbox.take`): up to `max_batch_size` rows (with `scheduling="dynamic"`
only into an empty batch), within the running-KV budget (`TorchEngineConfig.max_kv_bytes`:
every row counted at the batch's widest row, the batch's prompt head once:
`engine/batch_head.py`), waiting `admit_wait_s` for more arrivals when the engine was
idle. A request that does not fit is *held*: it is the first to join at a later step
(re-queued, it could wait behind smaller requests for as long as they come). Commands run
as they are taken; cancelled requests are dropped.

Each step first moves every queued item into the worker's own `pending` line, in order,
and hands each new request to `pin` (set by the engine: it pins the request's cached
prefix, `PrefixCache.pin`, so the KV it will start from outlives its wait); a request
dropped or aborted before its prefill goes to `unpin`, and the engine unpins the ones
that joined after their prefill.

Left out: prefilling the rows taken (`torch_engine.py`).
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from art_langgraph.engine.batch import RunningBatch
from art_langgraph.engine.batch_head import SharedCount
from art_langgraph.engine.request import Request
from art_langgraph.engine.torch_config import TorchEngineConfig


class Inbox:
    """The engine's queue and its admission rule (see the module doc)."""

    def __init__(
        self,
        config: TorchEngineConfig,
        kv_budget: int,
        kv_token_bytes: int,
        heads: bool,
        block_size: int,
    ) -> None:
        self.config = config
        self.kv_budget = kv_budget
        """Bytes the running batch's KV may take (0: no budget)."""
        self.kv_token_bytes = kv_token_bytes
        self.heads = heads
        """Whether rows forming a batch will hold their common head once."""
        self.block_size = block_size
        self.queue: queue.Queue[Any] = queue.Queue()
        self.held: Request | None = None
        """The oldest request that did not fit the batch: the next one admitted."""
        self.pending: deque[Any] = deque()
        """Items moved off `queue` by the worker, in order, not yet taken."""
        self.pin: Callable[[Request], None] = _nothing
        """Called on the worker for each request as it leaves `queue`."""
        self.unpin: Callable[[Request], None] = _nothing
        """Called on the worker for a pinned request dropped before its prefill."""

    def put(self, item: Any) -> None:
        """A request, a command ("cmd", fn, done), or None (wake the worker: closing)."""
        self.queue.put(item)

    def empty(self) -> bool:
        return self.queue.empty() and not self.pending

    def waiting(self) -> int:
        mine = sum(isinstance(item, Request) for item in self.pending)
        return self.queue.qsize() + mine + (self.held is not None)

    def _arrived(self, item: Any) -> Any:
        if isinstance(item, Request) and not item.cancelled:
            self.pin(item)
        return item

    def _drain(self) -> None:
        """Move every queued item to `pending`, pinning each request's prefix."""
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
            self.pending.append(self._arrived(item))

    def take(
        self, batch: RunningBatch, *, block: bool, closing: Callable[[], bool]
    ) -> list[Request]:
        """The requests that join `batch` at this step (running the commands met on the
        way); `block`: wait for one (the engine is idle)."""
        new: list[Request] = []
        running = batch.live()
        room = self.config.max_batch_size - len(running)
        if self.config.scheduling == "dynamic" and running:
            room = 0
        width = max((r.kv_width() for r in running), default=0)
        # tokens every row holds once: the batch's head, or the one these rows will form
        shared = SharedCount(
            batch.head if running else None,
            forming=self.heads and not running,
            block_size=self.block_size,
        )
        deadline = None
        self._drain()
        while True:
            if self.held is not None:
                item, self.held = self.held, None
            elif self.pending:
                item = self.pending.popleft()
            else:
                try:
                    if block and not new:
                        item = self.queue.get(timeout=0.5)
                    elif deadline is not None:
                        item = self.queue.get(timeout=max(0.0, deadline - time.perf_counter()))
                    else:
                        item = self.queue.get_nowait()
                except queue.Empty:
                    if block and not new and not closing():
                        continue
                    break
                self._arrived(item)
            if item is None:
                break
            if isinstance(item, tuple):
                _, fn, done = item
                try:
                    fn()
                    done(None)
                except Exception as exc:
                    done(exc)
                continue
            if item.cancelled:
                self.unpin(item)
                continue
            rows = len(running) + len(new) + 1
            wide = max(width, item.kv_width())
            once = shared.with_row(item.prompt_ids, item.adapter_key)
            if room <= len(new) or (
                # every row counted at the widest row, a head once; the first request of
                # an empty batch always runs
                self.kv_budget
                and rows > 1
                and (rows * (wide - once) + once) * self.kv_token_bytes > self.kv_budget
            ):
                self.held = item  # no room: it is the first to join at a later step
                break
            shared.add(item.prompt_ids, item.adapter_key)
            width = wide
            item.t_start = time.perf_counter()
            new.append(item)
            if block and deadline is None:
                deadline = time.perf_counter() + self.config.admit_wait_s
        return new

    def abort_all(self) -> None:
        """End the held request and every queued one with "abort" (the engine closed)."""
        self._drain()
        if self.held is not None:
            self.pending.appendleft(self.held)
            self.held = None
        while self.pending:
            item = self.pending.popleft()
            if isinstance(item, Request):
                self.unpin(item)
                item.emit(item.result("abort"))


def _nothing(request: Request) -> None:
    """The default `pin` and `unpin`: no prefix cache."""
