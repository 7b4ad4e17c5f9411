"""A mirror of TensorRT-LLM's block tree, built from its KV-cache events (§7.3).

Plain synchronous code. Events are the dicts of ``tensorrt_llm/_utils.py::
KVCacheEventSerializer`` (``created``, ``stored``, ``removed``, ``updated``). What the
mirror expects of them, from the 1.2 source:

- event ids are consecutive per manager; a gap (the engine's ring dropped its oldest
  events, or the late-2025 serializer failed on an ``updated`` event with a None field)
  is never trusted: the mirror turns *stale*, every block it holds becomes unconfirmed,
  and it resynchronises from later events and from finished requests' reuse counts
  (:meth:`Mirror.confirm_prefix`); once ``resync_events`` events have passed, blocks
  still unconfirmed are dropped as ghosts;
- ``updated`` events change one field and carry ``None`` in the other (a priority
  re-tag, then an onboard or offload: ``kvCacheManager.cpp::loadOrAllocateBlocks``,
  ``onboardBlock``, ``offloadBlock``); a merged event with both is applied too;
- a model with several attention windows sends every window's events on one id
  counter, one ``created`` per window; only the largest window is mirrored, as Dynamo's
  publisher does (``components/src/dynamo/trtllm/publisher.py``);
- ``stored`` blocks with fewer than ``tokens_per_block`` tokens (a request's trailing
  partial block, ``WindowBlockManager::releaseBlocks``) are not mirrored, and their
  later ``removed``/``updated`` events are skipped (as Dynamo does);
- in 1.2.x an iteration's removes may be flushed after its stores (fixed on main by
  PR #11883), so a ``removed(h)`` can follow the re-store of ``h``: a remove of a hash
  stored earlier in the same batch (one poll's events, :meth:`Mirror.apply_all`) most
  likely refers to the old block, so the block is kept but marked *suspect* (a batch
  can also span two iterations, where the remove was real); a later ``stored`` or
  ``updated`` event, or a request that reuses it, clears the doubt, and a request
  submitted after the doubt arose that stops right before it proves it gone
  (:meth:`Mirror.confirm_prefix`);
- a malformed event (the serializer turns a missing event into ``{}``) is skipped and
  counted by :meth:`Mirror.apply_all`; :meth:`Mirror.apply` refuses it.

The KV manager's lifecycle state (accessors ``A_w(c)``, retired flag, ``Score(c)``)
lives on the mirror's blocks, so :class:`pbkv.kvmanager.ScoreBoard` scores them as it
scores radix-tree nodes.
"""

from __future__ import annotations

import logging
from collections import deque
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
        confirmed: seen in an event or a request's reuse since the last gap (a block
            whose late removal was skipped is unconfirmed: *suspect*).
        suspect_since: events applied when it became suspect (``None`` if not).
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
        "suspect_since",
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
        self.suspect_since: int | None = None

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
    """Events applied, gaps seen and events lost in them, resyncs, unknown references;
    events skipped: of other attention windows, of partial blocks, late removals of
    re-stored blocks, malformed ones; blocks per level; attention windows announced."""

    events: int
    gaps: int
    lost_events: int
    resyncs: int
    ghosts_dropped: int
    unknown_refs: int
    gpu_blocks: int
    host_blocks: int
    other_window_events: int = 0
    partial_block_events: int = 0
    late_removals: int = 0
    malformed_events: int = 0
    windows: int = 1


class Mirror:
    """The engine's block tree, from its events.

    Args:
        resync_events: events to wait after a gap before unconfirmed blocks are dropped.
        on_remove: called with each block that leaves the mirror (score bookkeeping).
        tokens_per_block: the engine's page size; stored blocks with fewer tokens are
            partial and not mirrored (``None``: every stored block is mirrored).
    """

    def __init__(
        self,
        resync_events: int = 1024,
        on_remove: Callable[[MirrorBlock], None] | None = None,
        tokens_per_block: int | None = None,
    ) -> None:
        self.resync_events = resync_events
        self.on_remove = on_remove or (lambda _: None)
        self.tokens_per_block = tokens_per_block
        self.blocks: dict[int, MirrorBlock] = {}
        self.num_blocks_per_level: tuple[int, int] | None = None
        self.last_event_id: int | None = None
        self.window_size: int | None = None  # the mirrored (largest) window
        self.stale = False
        self._windows: set[int] = set()
        self._partial: set[int] = set()  # hashes of partial blocks stored, not mirrored
        self._new: deque[int] = deque(maxlen=1 << 16)  # mirrored since drain_new()
        self._batch_stored: set[int] | None = None  # hashes stored in the current batch
        self._since_gap = 0
        self._levels = [0, 0]  # blocks per level
        self._low_gpu = 0  # GPU blocks below the offload threshold
        self._counts = dict.fromkeys(
            (
                "events",
                "gaps",
                "lost",
                "resyncs",
                "ghosts",
                "unknown",
                "other_window",
                "partial",
                "late",
                "malformed",
            ),
            0,
        )

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
        if kind not in ("created", "stored", "removed", "updated"):
            raise ValueError(f"event {event_id}: unknown type {kind!r}")
        self._check_sequence(int(event_id))
        self._counts["events"] += 1
        if kind == "created":
            self._created(data, event.get("window_size"))
        elif not self._in_window(event.get("window_size")):
            self._counts["other_window"] += 1
        elif kind == "stored":
            self._stored(data.get("parent_hash"), data["blocks"])
        elif kind == "removed":
            self._removed(data["block_hashes"])
        else:
            self._updated(data)
        if self.stale:
            self._since_gap += 1
            if self._since_gap >= self.resync_events:
                self.finish_resync()

    def apply_all(self, events: Iterable[dict[str, Any]]) -> int:
        """Apply one batch of events (one poll's) in order; return how many applied.

        A ``removed`` of a hash stored earlier in the batch is skipped (a late removal,
        see the module notes); a malformed event is skipped, counted and logged.

        Mutates: the mirror.
        """
        n = 0
        self._batch_stored = set()
        try:
            for event in events:
                try:
                    self.apply(event)
                except (ValueError, KeyError, TypeError) as exc:
                    self._counts["malformed"] += 1
                    log.warning("skipping a malformed KV event: %s", exc)
                    continue
                n += 1
        finally:
            self._batch_stored = None
        return n

    def drain_new(self) -> list[int]:
        """Return the hashes mirrored since the last call (newest last, at most 65,536)
        and forget them."""
        out = list(self._new)
        self._new.clear()
        return out

    @property
    def window_count(self) -> int:
        """Attention windows the engine announced (per-request block counts sum them)."""
        return max(1, len(self._windows))

    def _created(self, data: dict[str, Any], window: int | None) -> None:
        n_gpu, n_host = data["num_blocks_per_cache_level"]
        if window is not None:
            self._windows.add(int(window))
        if window is None or self.window_size is None or int(window) >= self.window_size:
            self.window_size = None if window is None else int(window)
            self.num_blocks_per_level = (int(n_gpu), int(n_host))

    def _in_window(self, window: int | None) -> bool:
        """Whether an event belongs to the mirrored (largest) window."""
        if window is None or self.window_size is None:
            if window is not None:
                self.window_size = int(window)
            return True
        if int(window) > self.window_size:
            log.warning(
                "KV events of window %d after window %d: mirroring the larger",
                window,
                self.window_size,
            )
            self.window_size = int(window)
        return int(window) == self.window_size

    def _removed(self, hashes: Sequence[int]) -> None:
        gone: set[int] = set()
        for h in hashes:
            if h in self._partial:
                self._partial.discard(h)
                self._counts["partial"] += 1
            elif self._batch_stored is not None and h in self._batch_stored:
                self._counts["late"] += 1  # most likely the old block of a hash stored since
                node = self.blocks.get(h)
                if node is not None:
                    node.confirmed = False
                    node.suspect_since = self._counts["events"]
            elif h not in gone:  # already gone with a removed ancestor
                gone |= self._remove(h)

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
        bs = self.tokens_per_block
        for b in blocks:
            h = b["block_hash"]
            tokens = tuple(t["token_id"] for t in b.get("tokens", ()))
            if bs is not None and len(tokens) < bs:
                self._partial.add(h)  # a trailing partial block: always the last
                self._counts["partial"] += 1
                continue
            if self._batch_stored is not None:
                self._batch_stored.add(h)
            node = self.blocks.get(h)
            if node is None:
                node = self._add(h, tokens, parent)
            elif node.tokens is None:
                node.tokens = tokens
            self._set(
                node, int(b.get("cache_level", GPU)), int(b.get("priority", DEFAULT_PRIORITY))
            )
            node.confirmed, node.suspect_since = True, None
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
        self._new.append(h)
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
            key = "partial" if data["block_hash"] in self._partial else "unknown"
            self._counts[key] += 1
            return
        level, priority = node.level, node.priority
        if data.get("cache_level") is not None:
            level = int(data["cache_level"]["new_value"])
        if data.get("priority") is not None:
            priority = int(data["priority"]["new_value"])
        self._set(node, level, priority)
        node.confirmed, node.suspect_since = True, None

    def _count(self, node: MirrorBlock, sign: int) -> None:
        self._levels[node.level] += sign
        if node.level == GPU and node.priority < OFFLOAD_MIN_PRIORITY:
            self._low_gpu += sign

    def _set(self, node: MirrorBlock, level: int, priority: int) -> None:
        self._count(node, -1)
        node.level, node.priority = level, priority
        self._count(node, +1)

    def note_claim(self, block: MirrorBlock, priority: int) -> None:
        """Record that a finished request claimed ``block`` with an explicit ``priority``
        (the engine applied it, ``evictionPolicy.cpp::claimBlock``; its ``updated`` event
        follows and agrees). A block no longer mirrored is left alone.

        Mutates: the block's priority and the level counts.
        """
        if self.blocks.get(block.hash) is block:
            self._set(block, block.level, priority)

    # -- resync -----------------------------------------------------------------------

    @property
    def events_applied(self) -> int:
        """Events applied so far: a request's mark for :meth:`confirm_prefix`."""
        return self._counts["events"]

    def confirm_prefix(
        self,
        hashes: Sequence[int],
        block_tokens: Sequence[tuple[int, ...]],
        reused_blocks: int,
        submitted_mark: int | None = None,
    ) -> None:
        """Learn from a finished request: its first ``reused_blocks`` blocks were cached
        (now on GPU); the block right past them was not, so if the mirror doubts it
        (stale after a gap, or suspect since before ``submitted_mark``) it is a ghost.

        Args:
            hashes: the prompt's reusable full-block hashes, root first.
            block_tokens: the token ids of those blocks.
            reused_blocks: full blocks the request reused.
            submitted_mark: :attr:`events_applied` when the request was submitted.

        Mutates: the mirror (creates, confirms or drops blocks).
        """
        parent: MirrorBlock | None = None
        for i, h in enumerate(hashes):
            node = self.blocks.get(h)
            if i < reused_blocks:
                if node is None:
                    node = self._add(h, tuple(block_tokens[i]), parent)
                node.confirmed, node.suspect_since = True, None
                self._set(node, GPU, node.priority)
            elif node is not None and not node.confirmed and self._doubted(node, submitted_mark):
                self._counts["ghosts"] += 1
                self._remove(h)
                return
            if node is None:
                return
            parent = node

    def _doubted(self, node: MirrorBlock, submitted_mark: int | None) -> bool:
        if self.stale:
            return True
        since = node.suspect_since
        return since is not None and submitted_mark is not None and submitted_mark >= since

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
            other_window_events=c["other_window"],
            partial_block_events=c["partial"],
            late_removals=c["late"],
            malformed_events=c["malformed"],
            windows=self.window_count,
        )
