"""The torch engine's prefix cache: the KV of earlier requests, kept across requests.

An agent rollout is a chain of calls whose prompts extend each other, and a GRPO group
runs several chains from one prompt. `PrefixCache` keeps the keys and values the engine
computed for finished and running requests, so a new request prefills only what no
earlier request computed under the same weights.

Layout: a chain of fixed-size blocks (`block_size` tokens each, 16 by default, as
vLLM's). A block is keyed by its parent block and its own token ids, and the first
block of a chain by the *weights identity* the KV was computed under (the base model,
or one load of one adapter). So lookup walks from the root one block at a time with
exact dict keys: no hash collisions are possible, and KV computed under one adapter is
never found under another's, nor after the adapter's weights are replaced (a new load
gets a new identity; `retire` drops the old one's blocks at once). This is vLLM's
block hash chain with equality instead of hashes; a radix tree would also reuse a
partial last block, but the engine then recomputes at most `block_size - 1` tokens,
and fixed blocks make the memory budget exact.

Each block holds its KV as one tensor (L, 2, H, block_size, D): L layers, keys and
values, H KV heads, D head size. Blocks are evicted least recently used first, under a
byte budget. A lookup or an insert touches a chain from its last block to its first,
so a parent is always more recently used than its children and eviction always takes
a leaf: a chain is shortened from its end, never cut in the middle.

Pins: a request waiting in the engine's queue pins the chain it will start from (`pin`,
looked up when it arrives), until its prefill has read it (`unpin`). An evaluation puts
every episode in flight at once; the batch runs a dozen rows, so an episode's next turn
waits while the others' turns finish and insert theirs, and under plain LRU those
inserts evicted its history first, every time: the working set cycles, LRU's worst case.
Pinned blocks are never evicted; an insert that finds no unpinned room caches less.

Left out: paged attention (the batch's KV stays a dense tensor, `engine/kv_cache.py`;
a hit is copied into it), partial blocks, sliding-window layers (the engine turns the
cache off for models that have them), and offloading to disk.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Block:
    id: int
    key: tuple[object, tuple[int, ...]]
    """(parent block id, or the root's identity; this block's token ids)."""
    kv: torch.Tensor
    """(L, 2, H, block_size, D)"""
    parent: _Block | None
    identity: str
    children: int = 0


@dataclass
class PrefixHit:
    """What a lookup found: the first `tokens` prompt tokens, in `blocks`."""

    tokens: int = 0
    blocks: list[_Block] = field(default_factory=list)

    def stacked(self) -> torch.Tensor:
        """The hit's KV, (k, L, 2, H, block_size, D) for k blocks: one copy."""
        return torch.stack([b.kv for b in self.blocks])


class PrefixCache:
    """KV blocks of earlier requests, keyed by weights identity and token ids (see the
    module docstring). Not thread-safe: the engine's worker thread owns it."""

    def __init__(self, budget_bytes: int, block_size: int = 16) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.budget_bytes = budget_bytes
        self.block_size = block_size
        self._blocks: dict[tuple[object, tuple[int, ...]], _Block] = {}
        self._lru: OrderedDict[int, _Block] = OrderedDict()  # oldest first
        self._by_identity: dict[str, set[int]] = {}
        self._dead: set[str] = set()
        self._ids = itertools.count()
        self.block_bytes = 0
        """Bytes of one block (set by the first insert)."""
        self.evictions = 0
        """Blocks evicted for room or dropped with a retired identity."""
        self._pins: dict[int, int] = {}
        """Block id -> how many waiting requests pinned it."""

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    @property
    def bytes(self) -> int:
        """Bytes of KV held now."""
        return len(self._lru) * self.block_bytes

    def __len__(self) -> int:
        return len(self._lru)

    # ---------------------------------------------------------------- lookup
    def lookup(self, identity: str, tokens: Sequence[int], limit: int) -> PrefixHit:
        """The longest cached prefix of `tokens` under `identity`, at most `limit` tokens."""
        hit = PrefixHit()
        if not self.enabled or identity in self._dead:
            return hit
        bs = self.block_size
        parent: object = identity
        for start in range(0, min(limit, len(tokens)) - bs + 1, bs):
            block = self._blocks.get((parent, tuple(tokens[start : start + bs])))
            if block is None:
                break
            hit.blocks.append(block)
            parent = block.id
        hit.tokens = len(hit.blocks) * bs
        self._touch(hit.blocks)
        return hit

    # ---------------------------------------------------------------- insert
    def insert_row(
        self,
        identity: str,
        tokens: Sequence[int],
        cache: Any,
        row: int,
        mask: torch.Tensor,
        skip: int = 0,
    ) -> int:
        """`insert` the full blocks of `tokens` from row `row` of a batch's KV `cache`, its
        real columns those where `mask` (T,) is 1. `tokens` are the row's prompt and
        completion: its KV holds all of them, or all but the last when that one was sampled
        and never fed (a row that ends on a forced token fed them all). `skip`: the first
        tokens' KV is not in the row but in its batch's head (`engine/batch_head.py`),
        whose blocks the cache must hold already. Returns the blocks added."""
        columns = mask.nonzero().squeeze(1)
        if not 0 <= len(tokens) - skip - len(columns) <= 1:  # a wrong key is worse
            log.warning("prefix cache: %d columns for %d tokens", len(columns), len(tokens) - skip)
            return 0
        tokens = tokens[: skip + len(columns)]
        layers = [(layer.keys[row], layer.values[row]) for layer in cache.layers]
        return self.insert(identity, tokens, layers, columns, skip)

    def insert(
        self,
        identity: str,
        tokens: Sequence[int],
        layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
        columns: torch.Tensor,
        skip: int = 0,
    ) -> int:
        """Cache the full blocks of `tokens` whose KV is not cached yet. `layers` holds
        each layer's (keys, values) of one row, (H, T, D), and `columns` the time index in
        them of each token after the first `skip` (len(tokens) - skip). The first `skip`
        tokens' blocks must be cached already (none is added otherwise). Returns the
        blocks added."""
        if not self.enabled or identity in self._dead:
            return 0
        bs = self.block_size
        n_full = len(tokens) // bs
        if n_full == 0:
            return 0
        known = self.lookup(identity, tokens, n_full * bs)
        first = len(known.blocks)
        if first == n_full or first * bs < skip:
            return 0
        n_new = n_full - first
        k0 = layers[0][0]
        h, d = k0.shape[0], k0.shape[-1]
        block_bytes = len(layers) * 2 * h * bs * d * k0.element_size()
        if self.block_bytes == 0:
            self.block_bytes = block_bytes
        # The chain's known blocks and the pinned ones stay; what does not fit beside them
        # is not cached.
        fixed = {b.id for b in known.blocks} | self._pins.keys()
        n_new = min(n_new, self.budget_bytes // self.block_bytes - len(fixed))
        if n_new <= 0:
            return 0
        cols = columns[first * bs - skip : (first + n_new) * bs - skip]
        slab = k0.new_empty((n_new, len(layers), 2, h, bs, d))
        for i, (k, v) in enumerate(layers):
            # (H, n*bs, D) -> (n, H, bs, D)
            slab[:, i, 0] = k.index_select(1, cols).view(h, n_new, bs, d).transpose(0, 1)
            slab[:, i, 1] = v.index_select(1, cols).view(h, n_new, bs, d).transpose(0, 1)
        self._make_room(n_new, keep=known.blocks)
        parent = known.blocks[-1] if known.blocks else None
        added: list[_Block] = []
        for j in range(n_new):
            start = (first + j) * bs
            key = (parent.id if parent else identity, tuple(tokens[start : start + bs]))
            block = _Block(next(self._ids), key, slab[j].clone(), parent, identity)
            if parent is not None:
                parent.children += 1
            self._blocks[key] = block
            self._by_identity.setdefault(identity, set()).add(block.id)
            added.append(block)
            parent = block
        self._touch([*known.blocks, *added])
        return len(added)

    # ------------------------------------------------------------------ pins
    def pin(self, blocks: Sequence[_Block]) -> None:
        """Keep `blocks` (a lookup's chain) from eviction until `unpin`ned as often."""
        for b in blocks:
            self._pins[b.id] = self._pins.get(b.id, 0) + 1

    def unpin(self, blocks: Sequence[_Block]) -> None:
        """Undo one `pin` of `blocks` (blocks dropped since, with their identity, are
        skipped)."""
        for b in blocks:
            n = self._pins.get(b.id, 0) - 1
            if n > 0:
                self._pins[b.id] = n
            else:
                self._pins.pop(b.id, None)

    @property
    def pinned(self) -> int:
        """Blocks pinned now."""
        return len(self._pins)

    # -------------------------------------------------------------- eviction
    def retire(self, identity: str) -> None:
        """Drop every block computed under `identity` and refuse it from now on (its
        weights were replaced or unloaded)."""
        self._dead.add(identity)
        ids = self._by_identity.pop(identity, set())
        for block_id in ids:
            block = self._lru.pop(block_id)
            del self._blocks[block.key]
            self._pins.pop(block_id, None)
        self.evictions += len(ids)

    def clear(self) -> None:
        """Drop every block (identities stay usable)."""
        self._blocks.clear()
        self._lru.clear()
        self._by_identity.clear()
        self._pins.clear()

    def _touch(self, chain: list[_Block]) -> None:
        for block in reversed(chain):  # the root last: the most recently used
            self._lru[block.id] = block
            self._lru.move_to_end(block.id)

    def _make_room(self, n: int, keep: list[_Block]) -> None:
        """Evict least recently used leaves until `n` more blocks fit; never `keep` nor
        a pinned block (a pinned chain is pinned whole, so its parents are too)."""
        keep_ids = {b.id for b in keep} | self._pins.keys()
        limit = self.budget_bytes // self.block_bytes
        while len(self._lru) + n > limit:
            victim = next((b for b in self._lru.values() if b.id not in keep_ids), None)
            if victim is None:
                return
            self._evict(victim)

    def _evict(self, block: _Block) -> None:
        # A leaf by the touch order; were it not, its children would be unreachable, so
        # they go first.
        if block.children:
            for child in [b for b in self._lru.values() if b.parent is block]:
                self._evict(child)
        self._lru.pop(block.id)
        del self._blocks[block.key]
        self._by_identity.get(block.identity, set()).discard(block.id)
        if block.parent is not None:
            block.parent.children -= 1
        self.evictions += 1


def waiting_pins(
    cache: PrefixCache, identity: Callable[[str], str]
) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
    """The engine inbox's `pin` and `unpin` of a waiting request (`engine/request.py`'s
    `Request`): pin the chain its prompt would start from now, under the weights identity
    of its adapter key; unpin what it pinned."""

    def pin(r: Any) -> None:
        hit = cache.lookup(identity(r.adapter_key), r.prompt_ids, len(r.prompt_ids) - 1)
        cache.pin(hit.blocks)
        r.pinned = hit.blocks

    def unpin(r: Any) -> None:
        cache.unpin(r.pinned)
        r.pinned = []

    return pin, unpin


def full_attention_only(config: Any) -> bool:
    """Whether every layer of the model attends to the whole context (no sliding window):
    the prefix cache serves only such models."""
    kinds = getattr(config, "layer_types", None)
    return not kinds or all(k == "full_attention" for k in kinds)
