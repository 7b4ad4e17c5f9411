"""The free queues of the fake TensorRT-LLM block manager (:mod:`.fake`): which free
block eviction takes next, and when a retained block's duration lapses.

Per cache level, upstream keeps 101 FIFO queues, one per priority, and takes a free block
from the front of the lowest non-empty one (``evictionPolicy.cpp``). Here one heap per
level is ordered as those queues are scanned (priority, then release order) and holds
the free leaves; an entry that went stale (the block was claimed, moved, re-prioritised
or released again) is skipped when it reaches the front. A released block with a
duration and a non-default priority goes back to priority 35 once its duration has
lapsed since its last release (``evictionPolicy.cpp::releaseBlock``/``refresh``).

Plain synchronous code, no trio.
"""

from __future__ import annotations

import heapq

from pbkv.engines.trtllm.api import DEFAULT_PRIORITY
from pbkv.engines.trtllm.fake_records import Block


class FreeQueues:
    """The free blocks of both cache levels, in the order eviction takes them.

    Args:
        root: the radix tree's root (never queued).

    Attributes:
        free: per level, the blocks in the tree with no reference; the manager counts
            them as references are taken and dropped and as blocks move or leave.
    """

    def __init__(self, root: Block) -> None:
        self._root = root
        self._heaps: list[list[tuple[int, int, int, Block]]] = [[], []]
        self._expiries: list[tuple[float, int, Block]] = []
        self.free = [0, 0]

    def push(self, b: Block) -> None:
        """Queue ``b`` for eviction if it is a free leaf (its place: priority, release order)."""
        if b is not self._root and b.free and b.leaf:
            heapq.heappush(self._heaps[b.level], (b.priority, b.release_seq, b.block_id, b))

    def victim(self, level: int, now_s: float) -> Block | None:
        """Return the front of the lowest non-empty priority queue that is a leaf at
        ``level``, after lapsed durations are refreshed; ``None`` when no block is free.

        Mutates: drops stale entries (the victim itself stays queued).
        """
        self.refresh(now_s)
        heap = self._heaps[level]
        while heap:
            entry = heap[0]
            if self._valid(entry, level):
                return entry[3]
            heapq.heappop(heap)
        return None

    def expire_at(self, b: Block, expiry_s: float) -> None:
        """Have ``b``'s retention lapse at ``expiry_s`` unless it is claimed first.

        Mutates: ``b.expiry_s``.
        """
        b.expiry_s = expiry_s
        heapq.heappush(self._expiries, (expiry_s, b.block_id, b))

    def refresh(self, now_s: float) -> None:
        """Move free blocks whose duration has lapsed by ``now_s`` back to priority 35."""
        while self._expiries and self._expiries[0][0] <= now_s:
            expiry, _, b = heapq.heappop(self._expiries)
            if b.free and b.expiry_s == expiry:
                b.priority, b.expiry_s, b.duration_s = DEFAULT_PRIORITY, None, None
                self.push(b)

    @staticmethod
    def _valid(entry: tuple[int, int, int, Block], level: int) -> bool:
        priority, seq, _, b = entry
        return (
            b.free
            and b.level == level
            and b.leaf
            and b.priority == priority
            and b.release_seq == seq
        )
