"""A faithful fake of TensorRT-LLM 1.2's V1 KV block manager (engine-owned cache, §7.3).

Plain synchronous code, no trio. It implements the rules of
``../shared/reference/trtllm.md`` §2–3, each from the upstream file named here:

- blocks per cache level, announced by a ``created`` event
  (``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp``, ``kvCacheEventManager.cpp``);
- ``addSequence``: the prompt minus its **last token** is cut into full blocks and
  matched in the radix tree; a hit is claimed (an explicit priority re-tags it, *latest
  claim wins*, with an ``updated`` event; a claim without one keeps the priority and
  replaces the duration), a host hit is onboarded (``updated`` 1→0), a miss takes a free
  block (``kvCacheManager.cpp::loadOrAllocateBlocks``);
- token ranges map to blocks by each block's first token
  (``cpp/tensorrt_llm/executor/kvCacheRetentionConfig.cpp``);
- per level, 101 free queues (one per priority), LRU inside; a free block is taken from
  the front of the lowest non-empty queue, leaves only (``batch_manager/evictionPolicy.cpp``);
- a GPU victim with priority ≥ 30 is offloaded when the host can take it (keeps its
  priority, loses its duration, ``updated`` 0→1); otherwise it is dropped **with its
  subtree** (``removed``) (``WindowBlockManager::getFreeBlock``, ``freeChildren``);
- a released block with a duration and a non-default priority expires ``duration`` after
  its **last release** back to priority 35 (``evictionPolicy.cpp::refresh``);
- context blocks are stored after prefill, decode blocks at the end with the decode
  priority (``kvCacheManager.cpp::storeContextBlocks`` / ``storeBlocksForReuse``);
- events carry consecutive ids in the ``KVCacheEventSerializer`` dict schema
  (``tensorrt_llm/_utils.py``); consecutive removes are batched; the ring keeps
  ``event_buffer_max_size`` events and drops the oldest on overflow
  (``kvCacheEventManager.cpp``);
- per-request ``kv_cache_metrics`` (``tensorrt_llm/executor/result.py`` perf metrics).

Not modelled: partial-block reuse (``enable_partial_reuse``), beam search, multiple
attention windows, LoRA ids, the KV connector. Block hashes are the fake's own 64-bit
chained hash over (parent hash, tokens, cache salt on the first block), not
``BlockKeyHasher``'s values.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pbkv.engines.trtllm.api import DEFAULT_PRIORITY, OFFLOAD_MIN_PRIORITY

log = logging.getLogger(__name__)

GPU, HOST = 0, 1


_MASK = (1 << 64) - 1


def _salt_key(cache_salt: str) -> int:
    if not cache_salt:
        return 0
    return int.from_bytes(hashlib.blake2b(cache_salt.encode(), digest_size=8).digest(), "little")


def block_hash(tokens: Sequence[int], parent_hash: int | None, cache_salt: str = "") -> int:
    """Return the fake's 64-bit hash of one full block, chained over its prefix.

    The cache salt enters the first block's hash, so every later block differs too
    (tenants never share blocks). Deterministic across processes (no ``str`` hashing).
    """
    head = _salt_key(cache_salt) if parent_hash is None else parent_hash
    return hash((head, parent_hash is None, *tokens)) & _MASK


def prompt_block_hashes(
    prompt_token_ids: Sequence[int], tokens_per_block: int, cache_salt: str = ""
) -> list[int]:
    """Return the hashes of the prompt's reusable blocks: full blocks of all but its last
    token (the last prompt token is never reused)."""
    hashes: list[int] = []
    parent: int | None = None
    usable = len(prompt_token_ids) - 1
    tokens = tuple(prompt_token_ids)
    for start in range(0, usable - usable % tokens_per_block, tokens_per_block):
        parent = block_hash(tokens[start : start + tokens_per_block], parent, cache_salt)
        hashes.append(parent)
    return hashes


@dataclass(frozen=True, slots=True)
class BlockManagerConfig:
    """Sizes and switches of the fake, named after ``KvCacheConfig`` fields.

    Args:
        tokens_per_block: page size.
        gpu_blocks / host_blocks: blocks per cache level (``host_cache_size`` in blocks).
        event_buffer_max_size: KV-event ring size; 0 disables events.
        onboard_blocks: allow host→GPU onboarding (False also stops offloading, as V1).
        secondary_offload_min_priority: fixed at 30 in 1.2's PyTorch backend.
        window_size: the attention window reported in every event envelope.
    """

    tokens_per_block: int = 32
    gpu_blocks: int = 1024
    host_blocks: int = 0
    event_buffer_max_size: int = 1024
    onboard_blocks: bool = True
    secondary_offload_min_priority: int = OFFLOAD_MIN_PRIORITY
    window_size: int = 1 << 20

    def __post_init__(self) -> None:
        if self.tokens_per_block < 1 or self.gpu_blocks < 1 or self.host_blocks < 0:
            raise ValueError(f"bad block manager sizes: {self}")


@dataclass(eq=False, slots=True)
class Block:
    """One KV block: in the radix tree once stored, else private to its sequence."""

    block_id: int
    tokens: tuple[int, ...] = ()
    hash: int | None = None
    parent: Block | None = None
    children: dict[int, Block] = field(default_factory=dict)
    level: int = GPU
    priority: int = DEFAULT_PRIORITY
    duration_s: float | None = None
    expiry_s: float | None = None
    ref_count: int = 0
    release_seq: int = 0
    level_children: list[int] = field(default_factory=lambda: [0, 0])

    @property
    def in_tree(self) -> bool:
        return self.hash is not None

    @property
    def free(self) -> bool:
        """In the tree with no reference: sits in a free queue."""
        return self.hash is not None and self.ref_count == 0

    @property
    def leaf(self) -> bool:
        """No child at this block's own cache level (eviction takes leaves only)."""
        return self.level_children[self.level] == 0


@dataclass(frozen=True, slots=True)
class KvCacheMetrics:
    """``request_perf_metrics.kv_cache_metrics`` of one request (upstream field names)."""

    num_total_allocated_blocks: int
    num_new_allocated_blocks: int
    num_reused_blocks: int
    num_missed_blocks: int
    kv_cache_hit_rate: float


@dataclass(eq=False, slots=True)
class GenerationSequence:
    """A running request's blocks (``GenerationRequest`` upstream)."""

    request_id: int
    tokens: list[int]
    prompt_tokens: int
    cache_salt: str
    blocks: list[Block]
    per_block: list[tuple[int | None, float | None]]
    decode_priority: int
    decode_duration_s: float | None
    metrics: KvCacheMetrics
    onboarded_blocks: int
    reserved_blocks: int
    stored_blocks: int = 0


@dataclass(slots=True)
class FakeCounters:
    """Ground truth the real engine does not report (for the bench and tests)."""

    reused_gpu_blocks: int = 0
    onboarded_blocks: int = 0
    missed_blocks: int = 0
    offloaded_blocks: int = 0
    dropped_blocks: int = 0
    host_evicted_blocks: int = 0
    events_dropped: int = 0


class FakeBlockManager:
    """TensorRT-LLM 1.2's V1 block manager, as the reference notes give its rules.

    Args:
        config: sizes and switches.
        clock: current time in seconds (durations and expiries).

    The caller (``SimLLM``, or a test) plays the executor: ``add_sequence`` at
    admission, ``store_context_blocks`` after prefill, ``add_token`` per decoded token,
    ``remove_sequence`` at the end; ``get_latest_events`` drains the ring.
    """

    def __init__(self, config: BlockManagerConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.tokens_per_block = config.tokens_per_block
        self.num_blocks = (config.gpu_blocks, config.host_blocks)
        self._used = [0, 0]
        # Free queues: per level, a heap ordered as the 101 FIFO queues are scanned
        # (priority, then release order), holding free leaves; stale entries are
        # skipped on pop (see _valid).
        self._heaps: list[list[tuple[int, int, int, Block]]] = [[], []]
        self._free_count = [0, 0]
        self._expiries: list[tuple[float, int, Block]] = []
        self._tree: dict[int, Block] = {}
        self._roots: dict[int, Block] = {}
        self._sequences: dict[int, GenerationSequence] = {}
        self._reserved = 0
        self._ids = 0
        self._seq = 0
        self._event_id = 0
        self._events: deque[dict[str, Any]] = deque()
        self.counters = FakeCounters()
        self._emit({"type": "created", "num_blocks_per_cache_level": list(self.num_blocks)})

    # -- events -----------------------------------------------------------------------

    def _emit(self, data: dict[str, Any]) -> None:
        size = self.config.event_buffer_max_size
        if size == 0:
            return
        if (
            data["type"] == "removed"
            and self._events
            and self._events[-1]["data"]["type"] == "removed"
        ):
            self._events[-1]["data"]["block_hashes"].extend(data["block_hashes"])
            return
        if len(self._events) >= size:
            self._events.popleft()
            self.counters.events_dropped += 1
            log.warning("The event queue has reached the max size of %d; dropping the oldest", size)
        self._events.append(
            {"event_id": self._event_id, "data": data, "window_size": self.config.window_size}
        )
        self._event_id += 1

    def get_latest_events(self) -> list[dict[str, Any]]:
        """Drain and return the buffered events, oldest first."""
        out = list(self._events)
        self._events.clear()
        return out

    @property
    def pending_events(self) -> int:
        return len(self._events)

    # -- queries ----------------------------------------------------------------------

    def free_blocks(self, level: int) -> int:
        """Blocks of ``level`` holding nothing."""
        return self.num_blocks[level] - self._used[level]

    def reusable_blocks(self, level: int) -> int:
        """Blocks of ``level`` in the tree with no reference (evictable, eventually)."""
        return self._free_count[level]

    def lookup(self, h: int) -> Block | None:
        return self._tree.get(h)

    def blocks_needed(self, prompt_tokens: int, max_new_tokens: int) -> int:
        return math.ceil((prompt_tokens + max_new_tokens) / self.tokens_per_block)

    def can_add(
        self,
        prompt_token_ids: Sequence[int],
        max_new_tokens: int,
        salt: str = "",
        hashes: Sequence[int] | None = None,
    ) -> bool:
        """Whether a request fits now with every block reserved (GUARANTEED_NO_EVICT).

        ``hashes`` are the prompt's block hashes if the caller has them. Does not modify
        the manager.
        """
        held = claimed_free = 0
        if hashes is None:
            hashes = prompt_block_hashes(prompt_token_ids, self.tokens_per_block, salt)
        for h in hashes:
            b = self._tree.get(h)
            if b is None:
                break
            if b.level == GPU:
                held += 1
                claimed_free += b.ref_count == 0
        need = self.blocks_needed(len(prompt_token_ids), max_new_tokens) - held
        available = self.free_blocks(GPU) + self.reusable_blocks(GPU) - claimed_free
        return need <= available - self._reserved

    # -- admission ----------------------------------------------------------------------

    def add_sequence(
        self,
        request_id: int,
        prompt_token_ids: Sequence[int],
        max_new_tokens: int,
        retention: Any = None,
        cache_salt: str = "",
        hashes: Sequence[int] | None = None,
    ) -> GenerationSequence:
        """Match, claim, onboard and allocate the prompt's blocks (``addSequence``).

        Args:
            retention: a ``KvCacheRetentionConfig`` (real or stand-in) or ``None``.

        Raises:
            ValueError: an unknown or duplicate request id, or a request that cannot fit.

        Mutates: the tree, free queues, events.
        """
        if request_id in self._sequences:
            raise ValueError(f"request {request_id} already has a sequence")
        bs = self.tokens_per_block
        if hashes is None:
            hashes = prompt_block_hashes(prompt_token_ids, bs, cache_salt)
        if not self.can_add(prompt_token_ids, max_new_tokens, cache_salt, hashes):
            raise ValueError(f"request {request_id} does not fit in the GPU pool now")
        prompt = list(prompt_token_ids)
        n_blocks = math.ceil(len(prompt) / bs)
        per_block = per_block_retention(retention, bs, n_blocks)
        blocks: list[Block] = []
        onboarded = 0
        for i, h in enumerate(hashes):
            b = self._tree.get(h)
            if b is None:
                break
            onboarded += self._claim(b, *per_block[i])
            blocks.append(b)
        reused = len(blocks)
        for i in range(reused, n_blocks):
            blocks.append(self._allocate(*per_block[i]))
        total = self.blocks_needed(len(prompt), max_new_tokens)
        self._reserved += total - n_blocks
        missed = n_blocks - reused
        c = self.counters
        c.reused_gpu_blocks += reused - onboarded
        c.onboarded_blocks += onboarded
        c.missed_blocks += missed
        metrics = KvCacheMetrics(n_blocks, missed, reused, missed, reused / n_blocks)
        seq = GenerationSequence(
            request_id,
            prompt,
            len(prompt),
            cache_salt,
            blocks,
            per_block,
            getattr(retention, "decode_retention_priority", DEFAULT_PRIORITY),
            _seconds(getattr(retention, "decode_duration_ms", None)),
            metrics,
            onboarded,
            reserved_blocks=total,
            stored_blocks=reused,
        )
        self._sequences[request_id] = seq
        return seq

    def _claim(self, b: Block, priority: int | None, duration_s: float | None) -> int:
        """Take a reference on a matched block; re-tag it; onboard it. Returns 1 if onboarded."""
        if b.ref_count == 0:
            self._free_count[b.level] -= 1
        b.ref_count += 1
        old = b.priority
        if priority is not None:
            b.priority = priority
        b.duration_s = duration_s  # a claim always replaces the duration, even clearing it
        b.expiry_s = None
        onboard = b.level == HOST
        if onboard:
            self._take(GPU)
            self._used[HOST] -= 1
            self._move(b, GPU)
        if onboard or b.priority != old:
            self._emit(
                _updated(
                    b.hash,
                    (HOST, GPU) if onboard else None,
                    (old, b.priority) if b.priority != old else None,
                )
            )
        return int(onboard)

    def _allocate(self, priority: int | None, duration_s: float | None) -> Block:
        self._take(GPU)
        self._ids += 1
        return Block(
            self._ids,
            priority=DEFAULT_PRIORITY if priority is None else priority,
            duration_s=duration_s,
            ref_count=1,
        )

    # -- eviction ------------------------------------------------------------------------

    def _take(self, level: int) -> None:
        """Make one block of ``level`` hold nothing and count it used (``getFreeBlock``).

        Raises:
            RuntimeError: no block of ``level`` is free or evictable (a scheduler bug).
        """
        if self.free_blocks(level) == 0:
            victim = self._victim(level)
            if victim is None:
                raise RuntimeError(f"no free or evictable block at cache level {level}")
            if level == GPU and self._can_offload(victim):
                self._offload(victim)
            else:
                self._drop(victim)
        self._used[level] += 1

    def _victim(self, level: int) -> Block | None:
        """The front of the lowest non-empty priority queue that is a leaf at ``level``."""
        self.refresh()
        heap = self._heaps[level]
        while heap:
            entry = heap[0]
            if self._valid(entry, level):
                return entry[3]
            heapq.heappop(heap)
        return None

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

    def _push(self, b: Block) -> None:
        """Queue ``b`` for eviction if it is a free leaf (its place: priority, release order)."""
        if b.free and b.leaf:
            heapq.heappush(self._heaps[b.level], (b.priority, b.release_seq, b.block_id, b))

    def _move(self, b: Block, level: int) -> None:
        """Change ``b``'s cache level, keeping its parent's per-level child counts."""
        old = b.level
        b.level = level
        if b.free:
            self._free_count[old] -= 1
            self._free_count[level] += 1
        parent = b.parent
        if parent is not None:
            parent.level_children[old] -= 1
            parent.level_children[level] += 1
            self._push(parent)

    def _can_offload(self, b: Block) -> bool:
        c = self.config
        if not (
            c.host_blocks and c.onboard_blocks and b.priority >= c.secondary_offload_min_priority
        ):
            return False
        return self.free_blocks(HOST) > 0 or self._victim(HOST) is not None

    def _offload(self, b: Block) -> None:
        self._take(HOST)
        self._used[GPU] -= 1
        self._move(b, HOST)
        b.duration_s = b.expiry_s = None
        self._seq += 1
        b.release_seq = self._seq  # appended to the host queue
        self._push(b)
        self.counters.offloaded_blocks += 1
        self._emit(_updated(b.hash, (GPU, HOST), None))

    def _drop(self, b: Block) -> None:
        """Remove ``b`` and its whole subtree from the tree (``freeChildren``)."""
        removed: list[int] = []
        stack = [b]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            assert node.ref_count == 0 and node.hash is not None
            self._free_count[node.level] -= 1
            del self._tree[node.hash]
            self._used[node.level] -= 1
            if node is b and node.level == HOST:
                self.counters.host_evicted_blocks += 1
            else:
                self.counters.dropped_blocks += 1
            removed.append(node.hash)
            node.hash = None
        if b.parent is not None:
            del b.parent.children[removed[0]]
            b.parent.level_children[b.level] -= 1
            self._push(b.parent)
        else:
            del self._roots[removed[0]]
        self._emit({"type": "removed", "block_hashes": removed})

    def refresh(self) -> None:
        """Move free blocks whose duration has lapsed back to priority 35."""
        now = self.clock()
        while self._expiries and self._expiries[0][0] <= now:
            expiry, _, b = heapq.heappop(self._expiries)
            if b.free and b.expiry_s == expiry:
                b.priority, b.expiry_s, b.duration_s = DEFAULT_PRIORITY, None, None
                self._push(b)

    # -- running -------------------------------------------------------------------------

    def store_context_blocks(self, request_id: int) -> None:
        """Insert the prompt's full blocks into the tree after prefill (``stored`` event)."""
        seq = self._sequences[request_id]
        self._store(seq, seq.prompt_tokens // self.tokens_per_block)

    def add_token(self, request_id: int, token_id: int) -> None:
        """Append one generated token, taking a decode block at each block boundary."""
        seq = self._sequences[request_id]
        seq.tokens.append(token_id)
        if len(seq.tokens) > len(seq.blocks) * self.tokens_per_block:
            if len(seq.blocks) < seq.reserved_blocks:
                self._reserved -= 1
            seq.blocks.append(self._allocate(seq.decode_priority, seq.decode_duration_s))

    def remove_sequence(self, request_id: int) -> KvCacheMetrics:
        """Store the decode blocks, then release every block (``removeSequence``).

        Returns:
            The request's KV-cache metrics.
        """
        seq = self._sequences.pop(request_id)
        self._store(seq, len(seq.tokens) // self.tokens_per_block)
        self._reserved -= max(0, seq.reserved_blocks - len(seq.blocks))  # the unused promise
        for b in seq.blocks:
            self._release(b)
        return seq.metrics

    def _store(self, seq: GenerationSequence, full_blocks: int) -> None:
        """Insert blocks ``stored_blocks..full_blocks`` under the sequence's stored prefix.

        Storing stops at a block another request stored first; the rest stay private
        and are freed at release.
        """
        bs = self.tokens_per_block
        parent = seq.blocks[seq.stored_blocks - 1] if seq.stored_blocks else None
        if parent is not None and not parent.in_tree:
            return  # the chain broke at an earlier duplicate
        first_parent = parent.hash if parent is not None else None
        stored: list[dict[str, Any]] = []
        for i in range(seq.stored_blocks, full_blocks):
            b = seq.blocks[i]
            tokens = tuple(seq.tokens[i * bs : (i + 1) * bs])
            h = block_hash(tokens, parent.hash if parent is not None else None, seq.cache_salt)
            if h in self._tree:
                break
            b.tokens, b.hash, b.parent = tokens, h, parent
            self._tree[h] = b
            (parent.children if parent is not None else self._roots)[h] = b
            if parent is not None:
                parent.level_children[b.level] += 1
            stored.append(_stored_block(b))
            parent = b
        seq.stored_blocks = max(seq.stored_blocks, full_blocks)
        if stored:
            self._emit({"type": "stored", "parent_hash": first_parent, "blocks": stored})

    def _release(self, b: Block) -> None:
        b.ref_count -= 1
        if b.ref_count > 0:
            return
        if not b.in_tree:
            self._used[b.level] -= 1
            return
        self._seq += 1
        b.release_seq = self._seq
        self._free_count[b.level] += 1
        if b.duration_s is not None and b.priority != DEFAULT_PRIORITY:
            b.expiry_s = self.clock() + b.duration_s
            heapq.heappush(self._expiries, (b.expiry_s, b.block_id, b))
        self._push(b)

    def check_integrity(self) -> None:
        """Assert the conservation law per level: used == tree blocks + private held
        blocks, and the reserve is covered.

        Raises:
            AssertionError: with the numbers.
        """
        private = {id(b) for s in self._sequences.values() for b in s.blocks if not b.in_tree}
        for level in (GPU, HOST):
            in_tree = sum(1 for b in self._tree.values() if b.level == level)
            expected = in_tree + (len(private) if level == GPU else 0)
            if expected != self._used[level] or self._used[level] > self.num_blocks[level]:
                raise AssertionError(
                    f"level {level}: used {self._used[level]} of {self.num_blocks[level]}, "
                    f"tree {in_tree}, private {len(private)}"
                )
        if self._reserved < 0:
            raise AssertionError(f"negative reserve {self._reserved}")


def per_block_retention(
    retention: Any, tokens_per_block: int, num_blocks: int
) -> list[tuple[int | None, float | None]]:
    """Return ``(priority, duration_s)`` per prompt block: the range holding the block's
    first token, ``(None, None)`` where no range does
    (``kvCacheRetentionConfig.cpp::getPerBlockRetentionPriorityDuration``)."""
    ranges = list(getattr(retention, "token_range_retention_configs", None) or [])
    out: list[tuple[int | None, float | None]] = []
    for i in range(num_blocks):
        first = i * tokens_per_block
        hit = next(
            (
                r
                for r in ranges
                if r.token_start <= first and (r.token_end is None or first < r.token_end)
            ),
            None,
        )
        out.append((None, None) if hit is None else (hit.priority, _seconds(hit.duration_ms)))
    return out


def _seconds(duration: Any) -> float | None:
    if duration is None:
        return None
    return (
        duration.total_seconds() if hasattr(duration, "total_seconds") else float(duration) / 1000
    )


def _diff(old: int, new: int) -> dict[str, Any]:
    return {"type": "event_diff", "old_value": old, "new_value": new}


def _updated(
    h: int | None, level: tuple[int, int] | None, priority: tuple[int, int] | None
) -> dict[str, Any]:
    return {
        "type": "updated",
        "block_hash": h,
        "cache_level": None if level is None else _diff(*level),
        "priority": None if priority is None else _diff(*priority),
    }


def _stored_block(b: Block) -> dict[str, Any]:
    return {
        "type": "stored_block",
        "block_hash": b.hash,
        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in b.tokens],
        "cache_level": b.level,
        "priority": b.priority,
    }
