"""Honest bounds on cache hit rate from a run's recorded access order (§7.0, §9).

A KV manager given an :class:`AccessLog` records, in order, every admitted request's
prompt block keys (an *access*: each key found cached is a hit) and every commit of
computed blocks (an *insert*: the blocks exist and may be cached at no cost). From that
log:

- :func:`ceiling_hits` is the infinite-cache ceiling over **every** order of the same
  requests: a key can be hit only after it exists, so each distinct prompt key that no
  request ever produces by decoding must miss once. No policy and no scheduler exceeds
  it on the same requests.
- :func:`min_hits` is Belady's MIN, exact, over the recorded order at a capacity in
  blocks: at each access or insert of a key it keeps the key if its next access comes
  sooner than that of the resident key needed farthest in the future (bypass allowed);
  a key whose next occurrence is an insert is worth nothing to keep (it can be cached
  again for free then). Among keys needed equally far it evicts the one first seen last
  (a block before its prefix). It counts every resident key of an access as a hit, past
  a miss too: counting only up to the first miss (as a radix tree matches) would be
  tighter but no bound, since MIN's farthest-need choices are not prefix-closed. It
  ignores the prefix
  rule, leases and reservations, so it bounds every demand policy (no prefetch) on that
  order; prefetching can beat the GPU figure, demand caching cannot. Computed over each
  row's own access order (a scheduler changes the order).

Plain synchronous code; no trio, no engine.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

NEVER = 1 << 62
"""Next-need position of a key not accessed again before it can be re-inserted."""


@dataclass(frozen=True, slots=True)
class LoggedInsert:
    """A request's latest logged commit: the ids of every key it has committed, and the
    index of the event that lists them (:meth:`AccessLog.insert_extending`)."""

    ids: tuple[int, ...]
    event: int


@dataclass(slots=True)
class AccessLog:
    """Recorded accesses and inserts of one run, keys interned per namespace.

    Attributes:
        events: ``(is_access, key ids)`` in the order they happened.
        produced: key ids some request computed by decoding (beyond its prompt).
        prompt_tokens: total prompt tokens over the accesses.
        block_size: tokens per block.
    """

    block_size: int
    events: list[tuple[bool, tuple[int, ...]]] = field(default_factory=list)
    produced: set[int] = field(default_factory=set)
    prompt_tokens: int = 0
    _ids: dict[str, dict[int, int]] = field(default_factory=dict, repr=False)  # ns -> key -> id
    _interned: int = field(default=0, repr=False)
    _accessed_at: dict[int, int] = field(default_factory=dict, repr=False)  # id -> event

    def _intern(self, keys: Sequence[int], namespace: str) -> tuple[int, ...]:
        """Return each key's id: ``0, 1, ...`` over every namespace, in first-seen order."""
        ids = self._ids.get(namespace)
        if ids is None:
            ids = self._ids[namespace] = {}
        found = tuple(map(ids.get, keys))
        if None not in found:
            return found  # type: ignore[return-value]
        for k in keys:
            if k not in ids:
                ids[k] = self._interned
                self._interned += 1
        return tuple(map(ids.__getitem__, keys))

    def access(self, keys: Sequence[int], namespace: str, prompt_tokens: int) -> None:
        """Record an admitted request's prompt block keys. Mutates the log."""
        ids = self._intern(keys, namespace)
        at = len(self.events)
        self.events.append((True, ids))
        self._accessed_at.update(dict.fromkeys(ids, at))
        self.prompt_tokens += prompt_tokens

    def insert(self, keys: Sequence[int], namespace: str, prompt_blocks: int) -> None:
        """Record a commit of ``keys``; those past ``prompt_blocks`` were decoded.

        Mutates the log.
        """
        ids = self._intern(keys, namespace)
        self.events.append((False, ids))
        self.produced.update(ids[prompt_blocks:])

    def insert_extending(
        self,
        previous: LoggedInsert | None,
        keys: Sequence[int],
        namespace: str,
        prompt_blocks: int,
    ) -> LoggedInsert:
        """Do :meth:`insert` for ``keys``, a request's commit that extends its
        ``previous`` one (``None`` for its first); return this commit's record.

        Interns only the new keys, and drops from the previous commit's event every key
        not accessed since: an insert whose key's next occurrence is another insert
        changes nothing :func:`min_hits` or :func:`ceiling_hits` computes (the key is
        either absent or already held as needed never, and the next insert re-offers
        it). So a request's chunk commits, each extending the last, keep the log linear
        in the blocks committed rather than quadratic, with the same bounds as logging
        every commit whole.

        The keys accessed since form a prefix of the previous commit's: block keys chain
        the namespace and every earlier block (:func:`~pbkv.kvmanager.block_keys`), and
        an access lists a prompt's keys from its first block, so an access that holds a
        commit's ``j``-th key holds every key before it. The cut is found by bisection,
        so a commit costs its new keys, not the request's whole sequence again.

        Mutates the log.
        """
        prior = () if previous is None else previous.ids
        ids = prior + self._intern(keys[len(prior) :], namespace)
        if previous is not None:
            since, accessed_at = previous.event, self._accessed_at
            cut = bisect.bisect_left(prior, True, key=lambda k: accessed_at.get(k, -1) <= since)
            self.events[since] = (False, prior[:cut])
        self.events.append((False, ids))
        self.produced.update(ids[prompt_blocks:])
        return LoggedInsert(ids, len(self.events) - 1)

    @property
    def accessed_blocks(self) -> int:
        """Block accesses over all admitted prompts."""
        return sum(len(keys) for is_access, keys in self.events if is_access)

    def hit_rate(self, hit_blocks: int) -> float:
        """Return ``hit_blocks`` as a share of the logged prompt tokens."""
        return hit_blocks * self.block_size / self.prompt_tokens if self.prompt_tokens else 0.0


def ceiling_hits(log: AccessLog) -> int:
    """Return the most prompt blocks any order of the logged requests can hit.

    Infinite cache: every access hits except the first access of a key no request
    decodes (it must be prefilled once). Independent of order, policy and scheduler.
    """
    accessed: set[int] = set()
    for is_access, keys in log.events:
        if is_access:
            accessed.update(keys)
    return log.accessed_blocks - len(accessed - log.produced)


def min_hits(log: AccessLog, capacity_blocks: int) -> int:
    """Return the blocks Belady's MIN hits on the logged order with ``capacity_blocks``.

    Args:
        log: the recorded order.
        capacity_blocks: blocks the cache may hold at once, >= 0.

    Raises:
        ValueError: negative capacity.

    Does not modify the log. ``O(E log C)`` for ``E`` key occurrences.
    """
    if capacity_blocks < 0:
        raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
    need = _next_needs(log.events)
    resident: dict[int, int] = {}  # key -> its next-need position (heap entries may be stale)
    heap: list[tuple[int, int]] = []  # (-need, -key): farthest need, then last seen, on top
    hits = 0
    pos = 0
    for is_access, keys in log.events:
        if is_access:
            hits += sum(k in resident for k in keys)
        for k in keys:
            n = need[pos]
            pos += 1
            if k in resident:
                resident[k] = n
                heapq.heappush(heap, (-n, -k))
            elif n != NEVER and capacity_blocks > 0:
                if len(resident) >= capacity_blocks:
                    far = _farthest(heap, resident)
                    if resident[far] <= n:
                        continue  # bypass: every resident key is needed sooner
                    del resident[far]
                resident[k] = n
                heapq.heappush(heap, (-n, -k))
        if len(heap) > 4 * max(1, len(resident)) + 64:
            heap = [(-n, -k) for k, n in resident.items()]
            heapq.heapify(heap)
    return hits


def _farthest(heap: list[tuple[int, int]], resident: dict[int, int]) -> int:
    """Return the resident key with the farthest next need (of those, the last first seen),
    dropping stale heap entries."""
    while True:
        neg, negk = heap[0]
        if resident.get(-negk) == -neg:
            return -negk
        heapq.heappop(heap)


def _next_needs(events: Sequence[tuple[bool, tuple[int, ...]]]) -> list[int]:
    """Return, per key occurrence (flattened in order), the position of the key's next
    occurrence if that one is an access, else :data:`NEVER`."""
    flat = [(k, is_access) for is_access, keys in events for k in keys]
    out = [NEVER] * len(flat)
    following: dict[int, tuple[int, bool]] = {}
    for i in range(len(flat) - 1, -1, -1):
        k, is_access = flat[i]
        nxt = following.get(k)
        if nxt is not None and nxt[1]:
            out[i] = nxt[0]
        following[k] = (i, is_access)
    return out
