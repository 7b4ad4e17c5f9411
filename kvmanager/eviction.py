"""Eviction order: a priority index over the nodes that may leave one tier (§5.1–§5.2).

Scores go down as well as up (a workflow's forecast moves its mass elsewhere), so the
index re-pushes a node on every priority change and drops stale entries by version
when they surface; a lazy heap that only repairs on pop would evict on stale keys.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from pbkv.kvmanager.node import Node

Priority = tuple[Any, ...]

_heappush = heapq.heappush  # a module global: one lookup per update, not two
_STALE_FACTOR = 4
_SLACK = 1024
"""The heap is compacted once it holds ``_STALE_FACTOR`` times the entries that were live
at the last compaction, plus ``_SLACK``: stale entries cost memory, not order."""


class EvictionIndex:
    """Min-priority index of eviction candidates for one tier.

    Args:
        priority: the policy's key for a node; the smallest key is evicted first. Keys
            of one index all have one length (each policy's do).
        is_candidate: whether a node may be evicted from this tier right now (resident,
            unleased, no resident child in the tier).
    """

    def __init__(
        self, priority: Callable[[Node], Priority], is_candidate: Callable[[Node], bool]
    ) -> None:
        self._priority = priority
        self._is_candidate = is_candidate
        # (*priority, serial, version, node): equal priorities go by node serial (creation
        # order), never by update order, which follows set iteration over nodes (memory
        # addresses) and would make runs differ. One policy's keys all have one length,
        # so the flat entry orders as (priority, serial, version) would, with half the
        # tuple comparisons per sift.
        self._heap: list[tuple[Any, ...]] = []
        self._version: dict[int, int] = {}
        self._seq = itertools.count()
        self._compact_at = _SLACK  # heap length that triggers :meth:`_compact`

    def __len__(self) -> int:
        return len(self._version)

    def update(self, node: Node) -> None:
        """Record ``node``'s current priority (call after any change that may move it).

        Mutates: pushes a fresh entry; the node's older entries become stale.
        """
        # A fresh global number, never reused: a per-node count restarting after
        # remove() would let an old heap entry pass as current.
        version = next(self._seq)
        serial = node.serial
        self._version[serial] = version
        heap = self._heap
        _heappush(heap, self._priority(node) + (serial, version, node))
        if len(heap) > self._compact_at:
            self._compact()

    def remove(self, node: Node) -> None:
        """Forget ``node`` (it left the tier or the tree). Mutates the index."""
        self._version.pop(node.serial, None)

    def pop_min(self) -> Node | None:
        """Remove and return the candidate with the smallest priority, or ``None``.

        Mutates: the returned node leaves the index; call :meth:`update` to put it back.
        """
        while self._heap:
            entry = heapq.heappop(self._heap)
            node = entry[-1]
            if self._version.get(node.serial) != entry[-2]:
                continue
            del self._version[node.serial]
            if self._is_candidate(node):
                return node
        return None

    def peek_min(self) -> Node | None:
        """Return the candidate with the smallest priority, leaving it in the index.

        Mutates: drops the stale entries and non-candidates it passes, as
        :meth:`pop_min` does.
        """
        heap, versions = self._heap, self._version
        while heap:
            entry = heap[0]
            node = entry[-1]
            if versions.get(node.serial) != entry[-2]:
                heapq.heappop(heap)
                continue
            if self._is_candidate(node):
                return node
            heapq.heappop(heap)
            del versions[node.serial]
        return None

    def _compact(self) -> None:
        """Drop the stale entries; the next compaction comes once the heap is
        :data:`_STALE_FACTOR` times the live entries plus :data:`_SLACK` long."""
        live = [e for e in self._heap if self._version.get(e[-1].serial) == e[-2]]
        heapq.heapify(live)
        self._heap = live
        self._compact_at = _STALE_FACTOR * len(live) + _SLACK
