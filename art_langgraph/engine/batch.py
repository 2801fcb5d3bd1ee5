"""The torch engine's running batch: the rows decoding together and the tensors they share.

`RunningBatch` holds each row's request (None in a slot a retired row left, which keeps
its KV masked out until a new row fills it or the batch is compacted), the rows' KV cache
(`kv_cache.py`), the (B, T) attention mask, and each row's next token and its position.
New rows join by `merge` (into free slots in place when they fit, else by rebuilding the
buffers with them appended); `free` retires a row without a copy, and `shrink` then
compacts the batch, drops the columns no live row uses, or empties it; `squeeze_pads`
drops the masked columns fast-forward steps leave between a row's tokens. Where every row
opens with one prompt head, the batch holds that head's KV once (`head`) and the rows'
cache and mask only what follows it; `dissolve_head` puts it back into every row.

Left out: what the rows compute (`torch_engine.py`: prefill, decode, sampling, retiring)
and which rows are admitted (its admission, under `TorchEngineConfig`'s budgets).
"""

from __future__ import annotations

from typing import Any

import torch

from art_langgraph.engine.batch_head import BatchHead, dissolve, head_length
from art_langgraph.engine.kv_cache import drop_left, fill_rows, merge_rows, squeeze_columns
from art_langgraph.engine.request import Request
from art_langgraph.runtime.heap import release_free_memory


class RunningBatch:
    """The rows decoding together (see the module doc); only the engine's thread uses it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rows: list[Request | None] = []
        """Row slots: a request, or None where one retired and the slot waits for a new row."""
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # (B, T) 1 for real tokens
        self.next: torch.Tensor | None = None  # (B,) token to feed next
        self.pos: torch.Tensor | None = None  # (B,) its position
        self.admitted_in_place = 0
        """Rows admitted into free slots (no copy of the others)."""
        self.squeezed = 0
        """Times the batch was rebuilt without pads (`squeeze_pads`)."""
        self.head: BatchHead | None = None
        """The prompt head every row shares, its KV held once and not in the rows' cache
        (`engine/batch_head.py`); None: each row holds its whole context."""
        self.dissolved = 0
        """Times a head was put back into the rows (`dissolve_head`)."""
        self.condensed = 0
        """Times a head was taken out of the rows of a running batch (`condense_head`)."""

    @property
    def active(self) -> int:
        """Rows decoding now."""
        return sum(r is not None for r in self.rows)

    def live(self) -> list[Request]:
        return [r for r in self.rows if r is not None]

    def merge(
        self,
        new: list[Request],
        cache: Any,
        mask: torch.Tensor,
        nxt: torch.Tensor,
        pos: torch.Tensor,
    ) -> None:
        """Add the prefilled rows to the batch: into free slots in place when there are
        enough and the rows fit the batch's width (a copy of the new rows only), else by
        rebuilding the batch's buffers with them appended (a copy of every row)."""
        if not self.active:
            self.rows, self.cache, self.mask, self.next, self.pos = list(new), cache, mask, nxt, pos
            return
        assert self.mask is not None and self.next is not None and self.pos is not None
        t_old, t_new = self.mask.shape[1], mask.shape[1]
        free = [i for i, r in enumerate(self.rows) if r is None]
        if len(free) >= len(new) and t_new <= t_old and fill_rows(self.cache, cache, free, t_old):
            slots = torch.tensor(free[: len(new)], device=self.device)
            self.mask[slots] = pad_left_2d(mask, t_old)
            self.next = self.next.clone()
            self.next[slots], self.pos[slots] = nxt, pos
            for slot, r in zip(free, new, strict=False):
                self.rows[slot] = r
            self.admitted_in_place += len(new)
            return
        if free:
            self.compact()
            t_old = self.mask.shape[1]
        width = max(t_old, t_new)
        merge_rows(self.cache, cache, width)
        self.mask = torch.cat([pad_left_2d(self.mask, width), pad_left_2d(mask, width)], 0)
        self.next = torch.cat([self.next, nxt])
        self.pos = torch.cat([self.pos, pos])
        self.rows = self.rows + list(new)

    def dissolve_head(self) -> None:
        """Put the head's KV back into every row (one copy of every row) and go on without
        one: a row that does not share it is about to join."""
        head, self.head = self.head, None
        if head is None or not self.active:
            return
        assert self.mask is not None
        dissolve(self.cache, head)
        live = torch.tensor([r is not None for r in self.rows], dtype=self.mask.dtype)
        lead = live.to(self.device)[:, None].expand(-1, head.length)
        self.mask = torch.cat([lead, self.mask], 1)
        self.dissolved += 1

    def condense_head(self, new: list[Request], block_size: int) -> None:
        """Where this batch has no head (it formed from one row, or a row that shared none
        has left) and its live rows and the `new` ones all open with one
        (`batch_head.head_length`, under one weights identity): hold that head once, its
        KV from the first live row's, and drop it from every row (one copy of every row,
        `kv_cache.squeeze_columns`). Keys keep the positions they were computed at."""
        live = self.live()
        rows = [*live, *new]
        if self.head is not None or not live or len({r.identity for r in rows}) > 1:
            return
        n = head_length([r.prompt_ids for r in rows], block_size)
        if not n:
            return
        assert self.mask is not None
        first = next(i for i, r in enumerate(self.rows) if r is not None)
        cols = self.mask[first].nonzero().squeeze(1)[:n]
        layers = [
            (x.keys[first : first + 1, :, cols], x.values[first : first + 1, :, cols])
            for x in self.cache.layers
        ]
        real = self.mask.cumsum(-1)
        self.mask = self.mask.masked_fill((self.mask == 1) & (real <= n), 0)
        self.mask = squeeze_columns(self.cache, self.mask)
        self.head = BatchHead(tuple(live[0].prompt_ids[:n]), live[0].identity, layers)
        self.condensed += 1

    def free(self, i: int) -> None:
        """Row `i` has finished: its slot waits for a new row, its KV masked out."""
        assert self.mask is not None
        self.rows[i] = None
        self.mask[i] = 0

    def shrink(self) -> None:
        """After rows were freed: empty the batch when none is live, compact it once free
        slots outnumber live rows, else drop the columns no live row uses."""
        live = self.active
        if live == 0:
            self.reset()
        elif 2 * live < len(self.rows):
            self.compact()
        else:
            self.drop_unused_columns()

    def compact(self) -> None:
        """Drop the free slots from the batch (one copy of the live rows' KV)."""
        keep = [i for i, r in enumerate(self.rows) if r is not None]
        idx = torch.tensor(keep, device=self.device)
        self.rows = [self.rows[i] for i in keep]
        self.cache.batch_select_indices(idx)
        assert self.mask is not None and self.next is not None and self.pos is not None
        self.mask, self.next, self.pos = self.mask[idx], self.next[idx], self.pos[idx]
        self.drop_unused_columns()

    def drop_unused_columns(self) -> None:
        """Drop the left columns that no live row uses (a view, no copy)."""
        assert self.mask is not None
        used = self.mask.any(dim=0).nonzero()
        lead = int(used[0]) if len(used) else 0
        if lead:
            self.mask = self.mask[:, lead:]
            drop_left(self.cache, lead)

    def squeeze_pads(self) -> bool:
        """Rebuild the batch without the masked columns between rows' tokens once they make
        it a quarter (and 64 columns) wider than its longest row (`kv_cache.squeeze_columns`:
        one copy of every row's KV). Returns whether it did."""
        assert self.mask is not None
        longest = int(self.mask.sum(-1).max())
        if self.mask.shape[1] <= longest + max(64, longest // 4):
            return False
        self.mask = squeeze_columns(self.cache, self.mask)
        self.squeezed += 1
        return True

    def reset(self) -> None:
        """Empty the batch; its KV cache's blocks go back to the OS (heap.py)."""
        self.rows, self.cache, self.mask, self.next, self.pos = [], None, None, None, None
        self.head = None
        release_free_memory()


def pad_left_2d(x: torch.Tensor, width: int) -> torch.Tensor:
    """(B, T) -> (B, width), zeros on the left."""
    extra = width - x.shape[1]
    return x if extra == 0 else torch.nn.functional.pad(x, (extra, 0))
