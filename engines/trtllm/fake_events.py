"""The KV events of the fake TensorRT-LLM block manager (:mod:`.fake`), as the engine
queues and serializes them.

Events carry consecutive ids in the ``KVCacheEventSerializer`` dict schema
(``tensorrt_llm/_utils.py``). An :class:`EventQueue` holds the current iteration's events,
each emitted once per attention window (copies for the extra windows), and flushes them
once per iteration into a ring of ``event_buffer_max_size`` that drops the oldest on
overflow (``cpp/tensorrt_llm/batch_manager/kvCacheEventManager.cpp``). Consecutive removes
of one window are batched; with ``late_removals`` (1.2.x) an iteration's removes are
flushed after its other events, one event per window, so a ``removed(h)`` can follow the
re-store of ``h`` (upstream main orders them first since PR #11883, 2026-03).

Plain synchronous code, no trio.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from pbkv.engines.trtllm.fake_records import Block, BlockManagerConfig


class EventQueue:
    """One manager's KV events: the current iteration's, then the flushed ring.

    Args:
        config: the manager's configuration (windows, ring size, event order).
    """

    def __init__(self, config: BlockManagerConfig) -> None:
        self._config = config
        self._event_id = 0
        self._iteration: list[dict[str, Any]] = []  # events of the current iteration
        self._late_removed: dict[int, list[int]] = {}  # window -> hashes (late_removals)
        self._ring: deque[dict[str, Any]] = deque()  # the flushed ring

    def emit(self, data: dict[str, Any]) -> None:
        """Queue one event for every attention window (copies for the extra ones); nothing
        when events are off (``event_buffer_max_size`` 0).

        Mutates: the current iteration's events.
        """
        if self._config.event_buffer_max_size == 0:
            return
        for window in self._config.window_sizes:
            event = dict(data)
            if data["type"] == "removed":
                event["block_hashes"] = list(data["block_hashes"])  # extended in place
                self._enqueue_removed(event, window)
            else:
                self.enqueue(event, window)

    def enqueue(self, data: dict[str, Any], window: int) -> None:
        """Queue one event of ``window`` as it is, with the next event id; nothing when
        events are off (no event manager exists then, as in ``KVCacheManager``)."""
        if self._config.event_buffer_max_size == 0:
            return
        self._iteration.append({"event_id": self._event_id, "data": data, "window_size": window})
        self._event_id += 1

    def _enqueue_removed(self, data: dict[str, Any], window: int) -> None:
        if self._config.late_removals:
            self._late_removed.setdefault(window, []).extend(data["block_hashes"])
            return
        last = self._iteration[-1] if self._iteration else None
        if last and last["window_size"] == window and last["data"]["type"] == "removed":
            last["data"]["block_hashes"].extend(data["block_hashes"])
        else:
            self.enqueue(data, window)

    def flush(self) -> int:
        """End an iteration: move its events into the ring (``flushIterationEvents``).

        Returns:
            How many of the ring's oldest events were dropped to make room.

        Mutates: the ring.
        """
        for window, hashes in self._late_removed.items():
            self.enqueue({"type": "removed", "block_hashes": hashes}, window)
        self._late_removed.clear()
        size = self._config.event_buffer_max_size
        dropped = 0
        for event in self._iteration:
            if len(self._ring) >= size:
                self._ring.popleft()
                dropped += 1
            self._ring.append(event)
        self._iteration.clear()
        return dropped

    def drain(self) -> list[dict[str, Any]]:
        """Return the ring's events, oldest first, and empty it (the current iteration's
        events stay until :meth:`flush`)."""
        out = list(self._ring)
        self._ring.clear()
        return out

    @property
    def pending(self) -> int:
        """Events flushed to the ring and not yet drained."""
        return len(self._ring)


def created_event(num_blocks: Sequence[int]) -> dict[str, Any]:
    """A ``created`` event: the blocks per cache level (one per attention window)."""
    return {"type": "created", "num_blocks_per_cache_level": list(num_blocks)}


def removed_event(block_hashes: list[int]) -> dict[str, Any]:
    """A ``removed`` event: a dropped subtree's hashes, children first."""
    return {"type": "removed", "block_hashes": block_hashes}


def stored_event(parent_hash: int | None, blocks: Sequence[Block]) -> dict[str, Any]:
    """A ``stored`` event: ``blocks`` inserted under ``parent_hash`` (``None``: the root)."""
    return {
        "type": "stored",
        "parent_hash": parent_hash,
        "blocks": [_stored_block(b) for b in blocks],
    }


def updated_event(
    h: int, level: tuple[int, int] | None, priority: tuple[int, int] | None
) -> dict[str, Any]:
    """An ``updated`` event: upstream sends a level change and a priority change in
    separate events, the other field None (``KVCacheUpdatedData``)."""
    return {
        "type": "updated",
        "block_hash": h,
        "cache_level": None if level is None else _diff(*level),
        "priority": None if priority is None else _diff(*priority),
    }


def _diff(old: int, new: int) -> dict[str, Any]:
    return {"type": "event_diff", "old_value": old, "new_value": new}


def _stored_block(b: Block) -> dict[str, Any]:
    return {
        "type": "stored_block",
        "block_hash": b.hash,
        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in b.tokens],
        "cache_level": b.level,
        "priority": b.priority,
    }
