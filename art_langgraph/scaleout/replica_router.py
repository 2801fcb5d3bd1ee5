"""`ReplicaRouter`: which replica serves a request. The turns of one conversation stay on
one replica (its prefix cache holds their KV); a new conversation goes to the least
loaded replica.

The engine protocol carries no rollout id, only token ids, so a conversation is
recognised by its tokens. When a request finishes on replica r, the router remembers its
prompt followed by the first `follow_tokens` tokens of its completion (one key per
length, each a hash of the adapter and those tokens). The next turn of that conversation
starts with the same prompt and the same reply, so its prompt matches one of those keys:
the longest match names the replica. Two rollouts of one GRPO group share their first
prompt but not their replies (sampled), so their second turns part; their first turns
match no reply, count as new and are spread by load. Keys are per adapter: a conversation
that crosses a step starts afresh (the old step's KV is of no use to it).

A new conversation goes to the replica with the fewest requests in flight; ties go to
the one that was given the fewest requests so far, then to the lowest index.

Left out: cache-aware balancing beyond stickiness (a long conversation stays on its
replica however loaded it is: moving it would prefill it again), keys for prompts alone
(a shared system prompt does not attract requests), and knowledge of what a replica's
cache actually still holds (the key table is an LRU of `max_keys`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Collection, Sequence

from art_langgraph.errors import InfrastructureError

_MOD = (1 << 61) - 1  # a Mersenne prime: polynomial hashes of token prefixes
_MUL = 1_000_003


def _seed(adapter: str | None) -> int:
    h = 7
    for ch in adapter or "":
        h = (h * _MUL + ord(ch)) % _MOD
    return h


class ReplicaRouter:
    """Picks a replica per request (`choose`) and learns conversations (`record`).

    Not thread-safe: the engine holds a lock around each call."""

    def __init__(self, replicas: int, *, follow_tokens: int = 16, max_keys: int = 200_000) -> None:
        """`replicas`: how many (>= 1). `follow_tokens`: completion tokens remembered after
        each prompt (>= 1): a next turn whose template re-tokenizes the reply differently
        still matches on the tokens that agree. `max_keys`: the key table's size (LRU)."""
        if replicas < 1 or follow_tokens < 1 or max_keys < 1:
            raise ValueError(f"bad router sizes: {replicas}, {follow_tokens}, {max_keys}")
        self.replicas = replicas
        self.follow_tokens = follow_tokens
        self.max_keys = max_keys
        self.in_flight = [0] * replicas
        """Requests each replica is serving now (the engine counts them)."""
        self.given = [0] * replicas
        """Requests each replica was given so far (a tie-breaker, and for tests)."""
        self._keys: OrderedDict[tuple[int, int], int] = OrderedDict()  # (length, hash) -> replica
        self._lengths: Counter[int] = Counter()  # how many keys have each length

    def choose(self, prompt_ids: Sequence[int], adapter: str | None, up: Collection[int]) -> int:
        """The replica for this prompt among those `up`: the one that served the longest
        earlier turn of its conversation, else the least loaded."""
        if not up:
            raise InfrastructureError("no inference replica is up")
        sticky = self.follow(prompt_ids, adapter)
        if sticky is not None and sticky in up:
            pick = sticky
        else:
            pick = min(up, key=lambda i: (self.in_flight[i], self.given[i], i))
        self.given[pick] += 1
        return pick

    def follow(self, prompt_ids: Sequence[int], adapter: str | None) -> int | None:
        """The replica that served the longest earlier turn this prompt continues, if any."""
        if not self._keys:
            return None
        h = _seed(adapter)
        prefixes = [h]
        for t in prompt_ids:
            h = (h * _MUL + int(t) + 1) % _MOD
            prefixes.append(h)
        for n in range(len(prompt_ids), 0, -1):
            if n in self._lengths and (key := (n, prefixes[n])) in self._keys:
                self._keys.move_to_end(key)
                return self._keys[key]
        return None

    def record(
        self,
        replica: int,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        adapter: str | None,
    ) -> None:
        """Remember that `replica` served this prompt and reply (its next turn follows it)."""
        h = _seed(adapter)
        for t in prompt_ids:
            h = (h * _MUL + int(t) + 1) % _MOD
        n = len(prompt_ids)
        for t in completion_ids[: self.follow_tokens]:
            h = (h * _MUL + int(t) + 1) % _MOD
            n += 1
            key = (n, h)
            if key not in self._keys:
                self._lengths[n] += 1
            self._keys[key] = replica
            self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            (length, _), _ = self._keys.popitem(last=False)
            self._drop_length(length)

    def forget(self, replica: int) -> None:
        """Drop what `replica` served (it restarted: its cache is empty)."""
        for key in [k for k, r in self._keys.items() if r == replica]:
            del self._keys[key]
            self._drop_length(key[0])

    def _drop_length(self, length: int) -> None:
        self._lengths[length] -= 1
        if self._lengths[length] <= 0:
            del self._lengths[length]
