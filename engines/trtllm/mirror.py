"""A mirror of TensorRT-LLM's block tree, built from its KV-cache events (§7.3).

Plain synchronous code. Events are the dicts of ``tensorrt_llm/_utils.py::
KVCacheEventSerializer`` (``created``, ``stored``, ``removed``, ``updated``). Event ids
are consecutive per manager; a gap (the engine's ring dropped its oldest events) is
never trusted: the mirror turns *stale*, every block it holds becomes unconfirmed, and
it resynchronises from later events and from finished requests' reuse counts
(:meth:`Mirror.confirm_prefix`); once ``resync_events`` events have passed, blocks still
unconfirmed are dropped as ghosts.

The KV manager's lifecycle state (accessors ``A_w(c)``, retired flag, ``Score(c)``)
lives on the mirror's blocks, so :class:`pbkv.kvmanager.ScoreBoard` scores them as it
scores radix-tree nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pbkv.engines.trtllm.api import DEFAULT_PRIORITY, OFFLOAD_MIN_PRIORITY
from pbkv.kvmanager.node import NO_WORKFLOW

log = logging.getLogger(__name__)

GPU, HOST = 0, 1


class MirrorBlock:
    """One block of the engine's tree as the events report it.

    Attributes:
        hash: the engine's block hash.
        tokens: the block's token ids (``None`` for a parent known only by hash).
        parent / children: tree links (``children`` keyed by hash).
        level: 0 (GPU) or 1 (host).
        priority: the retention priority the engine last reported.
        confirmed: seen in an event or a request's reuse since the last gap.
        salt: the cache salt of the requests that used it (``None`` if unknown).
        accessors / retired / score / oldest: the KV manager's lifecycle state (§5.3).
    """

    __slots__ = (
        "hash",
        "tokens",
        "parent",
        "children",
        "level",
        "priority",
        "confirmed",
        "salt",
        "accessors",
        "retired",
        "score",
        "oldest",
        "pending_touch",
        "depth",
    )

    def __init__(self, h: int, tokens: tuple[int, ...] | None, parent: MirrorBlock | None) -> None:
        self.hash = h
        self.tokens = tokens
        self.parent = parent
        self.children: dict[int, MirrorBlock] = {}
        self.level = GPU
        self.priority = DEFAULT_PRIORITY
        self.confirmed = True
        self.salt: str | None = None
        self.accessors: dict[str, set[str]] = {}
        self.oldest = NO_WORKFLOW  # start ordinal of the oldest active accessor (scoring)
        self.retired = False
        self.score = 0.0
        self.pending_touch = False
        self.depth = 0 if parent is None else parent.depth + 1

    def path(self) -> list[MirrorBlock]:
        """Blocks from the root down to this one."""
        out = []
        node: MirrorBlock | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def __repr__(self) -> str:
        return (
            f"MirrorBlock({self.hash:#x}, level={self.level}, prio={self.priority}, "
            f"score={self.score:.3g}, retired={self.retired})"
        )


@dataclass(frozen=True, slots=True)
class MirrorStatistics:
    """Events applied, gaps seen and events lost in them, resyncs, unknown references."""

    events: int
    gaps: int
    lost_events: int
    resyncs: int
    ghosts_dropped: int
    unknown_refs: int
    gpu_blocks: int
    host_blocks: int


class Mirror:
    """The engine's block tree, from its events.

    Args:
        resync_events: events to wait after a gap before unconfirmed blocks are dropped.
        on_remove: called with each block that leaves the mirror (score bookkeeping).
    """

    def __init__(
        self,
        resync_events: int = 1024,
        on_remove: Callable[[MirrorBlock], None] | None = None,
    ) -> None:
        self.resync_events = resync_events
        self.on_remove = on_remove or (lambda _: None)
        self.blocks: dict[int, MirrorBlock] = {}
        self.num_blocks_per_level: tuple[int, int] | None = None
        self.last_event_id: int | None = None
        self.stale = False
        self._since_gap = 0
        self._levels = [0, 0]  # blocks per level
        self._low_gpu = 0  # GPU blocks below the offload threshold
        self._counts = dict(events=0, gaps=0, lost=0, resyncs=0, ghosts=0, unknown=0)

    # -- events -----------------------------------------------------------------------

    def apply(self, event: dict[str, Any]) -> None:
        """Apply one event dict (envelope ``{"event_id", "data", "window_size"}``).

        Raises:
            ValueError: an event without ``event_id`` or ``data.type``, or of an unknown type.

        Mutates: the mirror.
        """
        try:
            event_id, data, kind = event["event_id"], event["data"], event["data"]["type"]
        except (KeyError, TypeError):
            raise ValueError(f"not a KV-cache event: {event!r}") from None
        self._check_sequence(int(event_id))
        self._counts["events"] += 1
        match kind:
            case "created":
                n_gpu, n_host = data["num_blocks_per_cache_level"]
                self.num_blocks_per_level = (int(n_gpu), int(n_host))
            case "stored":
                self._stored(data.get("parent_hash"), data["blocks"])
            case "removed":
                gone: set[int] = set()
                for h in data["block_hashes"]:
                    if h not in gone:  # a subtree's hashes come listed after its root
                        gone |= self._remove(h)
            case "updated":
                self._updated(data)
            case _:
                raise ValueError(f"event {event_id}: unknown type {kind!r}")
        if self.stale:
            self._since_gap += 1
            if self._since_gap >= self.resync_events:
                self.finish_resync()

    def apply_all(self, events: Iterable[dict[str, Any]]) -> int:
        """Apply events in order; return how many."""
        n = 0
        for event in events:
            self.apply(event)
            n += 1
        return n

    def _check_sequence(self, event_id: int) -> None:
        last = self.last_event_id
        self.last_event_id = event_id
        if last is None or event_id == last + 1:
            return
        lost = event_id - last - 1
        log.warning(
            "KV events %d..%d lost (ring overflow): mirror is stale", last + 1, event_id - 1
        )
        self._counts["gaps"] += 1
        self._counts["lost"] += max(lost, 0)
        self.stale = True
        self._since_gap = 0
        for block in self.blocks.values():
            block.confirmed = False

    def _stored(self, parent_hash: int | None, blocks: Sequence[dict[str, Any]]) -> None:
        parent = None if parent_hash is None else self._known_or_placeholder(parent_hash)
        for b in blocks:
            tokens = tuple(t["token_id"] for t in b.get("tokens", ()))
            node = self.blocks.get(b["block_hash"])
            if node is None:
                node = self._add(b["block_hash"], tokens, parent)
            elif node.tokens is None:
                node.tokens = tokens
            self._set(
                node, int(b.get("cache_level", GPU)), int(b.get("priority", DEFAULT_PRIORITY))
            )
            node.confirmed = True
            parent = node

    def _known_or_placeholder(self, h: int) -> MirrorBlock:
        node = self.blocks.get(h)
        if node is None:  # stored during a gap: known only by hash until it shows up
            node = self._add(h, None, None)
        return node

    def _add(
        self, h: int, tokens: tuple[int, ...] | None, parent: MirrorBlock | None
    ) -> MirrorBlock:
        node = MirrorBlock(h, tokens, parent)
        self.blocks[h] = node
        self._count(node, +1)
        if parent is not None:
            parent.children[h] = node
        return node

    def _remove(self, h: int) -> set[int]:
        """Remove block ``h`` and its subtree; return the hashes removed."""
        node = self.blocks.get(h)
        if node is None:
            self._counts["unknown"] += 1
            return set()
        gone = set()
        stack = [node]
        while stack:  # dropping a block drops its subtree, listed or not
            n = stack.pop()
            stack.extend(n.children.values())
            if self.blocks.pop(n.hash, None) is not None:
                self._count(n, -1)
            gone.add(n.hash)
            self.on_remove(n)
        if node.parent is not None:
            node.parent.children.pop(h, None)
        return gone

    def _updated(self, data: dict[str, Any]) -> None:
        node = self.blocks.get(data["block_hash"])
        if node is None:
            self._counts["unknown"] += 1
            return
        level, priority = node.level, node.priority
        if data.get("cache_level") is not None:
            level = int(data["cache_level"]["new_value"])
        if data.get("priority") is not None:
            priority = int(data["priority"]["new_value"])
        self._set(node, level, priority)
        node.confirmed = True

    def _count(self, node: MirrorBlock, sign: int) -> None:
        self._levels[node.level] += sign
        if node.level == GPU and node.priority < OFFLOAD_MIN_PRIORITY:
            self._low_gpu += sign

    def _set(self, node: MirrorBlock, level: int, priority: int) -> None:
        self._count(node, -1)
        node.level, node.priority = level, priority
        self._count(node, +1)

    # -- resync -----------------------------------------------------------------------

    def confirm_prefix(
        self, hashes: Sequence[int], block_tokens: Sequence[tuple[int, ...]], reused_blocks: int
    ) -> None:
        """Learn from a finished request: its first ``reused_blocks`` blocks were cached
        (now on GPU); while stale, unconfirmed blocks past them on its path are ghosts.

        Args:
            hashes: the prompt's reusable block hashes, root first.
            block_tokens: the token ids of those blocks.
            reused_blocks: ``num_reused_blocks`` from the request's KV-cache metrics.

        Mutates: the mirror (creates, confirms or drops blocks).
        """
        parent: MirrorBlock | None = None
        for i, h in enumerate(hashes):
            node = self.blocks.get(h)
            if i < reused_blocks:
                if node is None:
                    node = self._add(h, tuple(block_tokens[i]), parent)
                node.confirmed = True
                self._set(node, GPU, node.priority)
            elif node is not None and self.stale and not node.confirmed:
                self._counts["ghosts"] += 1
                self._remove(h)
                return
            if node is None:
                return
            parent = node

    def finish_resync(self) -> None:
        """End a resync: drop every block no event or request has confirmed since the gap."""
        ghosts = [b for b in self.blocks.values() if not b.confirmed]
        for b in ghosts:
            if b.hash in self.blocks:
                self._counts["ghosts"] += 1
                self._remove(b.hash)
        self.stale = False
        self._counts["resyncs"] += 1

    # -- queries ------------------------------------------------------------------------

    def match(self, hashes: Sequence[int]) -> list[MirrorBlock]:
        """Return the mirrored blocks of a prompt's leading hashes, stopping at the first
        one the mirror lacks. Does not modify the mirror."""
        out = []
        for h in hashes:
            node = self.blocks.get(h)
            if node is None:
                break
            out.append(node)
        return out

    def count(self, level: int) -> int:
        """Blocks at ``level`` (O(1))."""
        return self._levels[level]

    @property
    def dead_gpu_blocks(self) -> int:
        """GPU blocks below the offload threshold (dropped first on eviction; O(1))."""
        return self._low_gpu

    def statistics(self) -> MirrorStatistics:
        c = self._counts
        return MirrorStatistics(
            events=c["events"],
            gaps=c["gaps"],
            lost_events=c["lost"],
            resyncs=c["resyncs"],
            ghosts_dropped=c["ghosts"],
            unknown_refs=c["unknown"],
            gpu_blocks=self.count(GPU),
            host_blocks=self.count(HOST),
        )
