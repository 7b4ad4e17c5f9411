"""A faithful fake of TensorRT-LLM 1.2's V1 KV block manager (engine-owned cache, §7.3).

Plain synchronous code, no trio. It implements the rules of
``../shared/reference/trtllm.md`` §2–3 and ``trtllm-1.2-source.md``, each from the
upstream file named here (``cpp/tensorrt_llm/batch_manager/`` unless said otherwise):

- blocks per cache level, announced by one ``created`` event per attention window
  (``kvCacheManager.cpp``, ``kvCacheEventManager.cpp``);
- block hashes are the engine's own (``kvCacheManager.cpp::BlockKeyHasher::hash``,
  ported in :mod:`.blockkey`), the cache salt mixed into the first block;
- ``addSequence``: the prompt minus its **last token** is cut into block keys, the last
  one possibly partial (plus an empty key when the last token starts a block), and
  matched in the radix tree (``WindowBlockManager::addSequence``, ``loadOrAllocateBlocks``):

  - an explicit priority that differs from a matched block's is reported first, in its
    own ``updated`` event with ``cache_level`` None; the claim then sets it (*latest
    claim wins*) and always replaces the duration (``evictionPolicy.cpp::claimBlock``);
  - a matched host block is onboarded, reported in a second ``updated`` event with
    ``priority`` None (``WindowBlockManager::onboardBlock``);
  - with ``enable_partial_reuse`` the first non-exact key may match a child by its
    longest common token prefix (``KVCacheBlock::findMatchingBlock``); a partially
    matched block in use or not a leaf is copied, else taken out of the tree without an
    event (``freeLeafBlock``); matching stops there; partial matches count as reused
    blocks, and the request's ``cached_tokens`` counts the tokens matched;
  - a miss takes a free block (``getFreeBlock``);
- token ranges map to blocks by each block's first token
  (``cpp/tensorrt_llm/executor/kvCacheRetentionConfig.cpp``);
- per level, 101 free queues (one per priority), LRU inside; a free block is taken from
  the front of the lowest non-empty queue (``evictionPolicy.cpp``);
- a GPU victim with priority ≥ 30 is offloaded when the host can take it (keeps its
  priority, loses its duration, ``updated`` 0→1); otherwise it is dropped **with its
  subtree**, children listed first in ``removed`` (``getFreeBlock``, ``freeChildren``);
- a released block with a duration and a non-default priority expires ``duration`` after
  its **last release** back to priority 35 (``evictionPolicy.cpp::releaseBlock``/``refresh``);
- context blocks (full blocks of the prompt minus its last token) are stored after
  prefill (``KVCacheManager::storeContextBlocks``); at the end, every block of the
  sequence minus its last token, **the trailing partial block included**, is stored with
  the blocks' own priorities, decode blocks at the decode priority
  (``WindowBlockManager::releaseBlocks``/``storeBlocks``); blocks are released last first;
- events carry consecutive ids in the ``KVCacheEventSerializer`` dict schema
  (``tensorrt_llm/_utils.py``); they are flushed once per iteration into a ring of
  ``event_buffer_max_size`` that drops the oldest on overflow (``kvCacheEventManager.cpp``);
  consecutive removes of one window are batched; with ``late_removals`` (1.2.x) an
  iteration's removes are flushed after its other events, so a ``removed(h)`` can follow
  the re-store of ``h`` (main orders them first since PR #11883, 2026-03);
- models with several attention windows: each extra window's events are copies of the
  main window's (same pool size, same keys), and per-request metrics are summed over
  windows, as ``KVCacheManager::addSequence`` sums the manager counters;
- per-request ``kv_cache_metrics`` (``tensorrt_llm/executor/result.py`` perf metrics).

Not modelled: beam search, LoRA ids, the KV connector, sliding-window detach, and two
rules of ``evictionPolicy.cpp`` that differ from this fake: empty blocks sit in the
priority-35 queue (so a cached block below 35 is evicted before empty blocks are used),
and a queue's front is taken even when it has children.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pbkv.engines.trtllm.api import DEFAULT_PRIORITY, OFFLOAD_MIN_PRIORITY
from pbkv.engines.trtllm.blockkey import block_key_hash, cache_salt_id, prompt_block_hashes

log = logging.getLogger(__name__)

GPU, HOST = 0, 1

__all__ = [
    "GPU",
    "HOST",
    "BlockManagerConfig",
    "FakeBlockManager",
    "KvCacheMetrics",
    "block_hash",
    "per_block_retention",
    "prompt_block_hashes",
]


def block_hash(tokens: Sequence[int], parent_hash: int | None, cache_salt: str = "") -> int:
    """Return the engine's hash of one block under ``parent_hash`` (``None``: the root).

    The cache salt enters the first block's hash only, so every later block differs too
    (``BlockKeyHasher::hash``; see :func:`pbkv.engines.trtllm.blockkey.block_key_hash`).
    """
    return block_key_hash(tokens, parent_hash or 0, cache_salt_id(cache_salt))


@dataclass(frozen=True, slots=True)
class BlockManagerConfig:
    """Sizes and switches of the fake, named after ``KvCacheConfig`` fields.

    Args:
        tokens_per_block: page size.
        gpu_blocks / host_blocks: blocks per cache level (``host_cache_size`` in blocks).
        event_buffer_max_size: KV-event ring size; 0 disables events.
        onboard_blocks: allow host→GPU onboarding (False also stops offloading, as V1).
        secondary_offload_min_priority: fixed at 30 in 1.2's PyTorch backend.
        enable_partial_reuse / copy_on_partial_reuse: ``KvCacheConfig``'s (both on by default).
        window_size: the attention window reported in the events' envelope.
        extra_window_sizes: other attention windows of the model (VSWA); their events
            are copies of the main window's.
        late_removals: 1.2.x event order (an iteration's removes after its other events).
    """

    tokens_per_block: int = 32
    gpu_blocks: int = 1024
    host_blocks: int = 0
    event_buffer_max_size: int = 1024
    onboard_blocks: bool = True
    secondary_offload_min_priority: int = OFFLOAD_MIN_PRIORITY
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    window_size: int = 1 << 20
    extra_window_sizes: tuple[int, ...] = ()
    late_removals: bool = True

    def __post_init__(self) -> None:
        if self.tokens_per_block < 1 or self.gpu_blocks < 1 or self.host_blocks < 0:
            raise ValueError(f"bad block manager sizes: {self}")
        if self.window_size in self.extra_window_sizes:
            raise ValueError(f"extra_window_sizes repeats the main window {self.window_size}")

    @property
    def window_sizes(self) -> tuple[int, ...]:
        """Every window, ascending (the order the engine's managers emit in)."""
        return tuple(sorted({self.window_size, *self.extra_window_sizes}))


Key = tuple[int | None, tuple[int, ...]]  # (cache salt id, tokens): a child's name


@dataclass(eq=False, slots=True)
class Block:
    """One KV block: in the radix tree once stored, else private to its sequence."""

    block_id: int
    tokens: tuple[int, ...] = ()
    salt: int | None = None
    hash: int = 0
    parent: Block | None = None
    children: dict[Key, Block] = field(default_factory=dict)
    in_tree: bool = False
    level: int = GPU
    priority: int = DEFAULT_PRIORITY
    duration_s: float | None = None
    expiry_s: float | None = None
    ref_count: int = 0
    release_seq: int = 0
    level_children: list[int] = field(default_factory=lambda: [0, 0])

    @property
    def key(self) -> Key:
        return (self.salt, self.tokens)

    @property
    def free(self) -> bool:
        """In the tree with no reference: sits in a free queue."""
        return self.in_tree and self.ref_count == 0

    @property
    def leaf(self) -> bool:
        """No child at this block's own cache level (eviction takes leaves only)."""
        return self.level_children[self.level] == 0


@dataclass(frozen=True, slots=True)
class KvCacheMetrics:
    """``request_perf_metrics.kv_cache_metrics`` of one request (upstream field names),
    summed over attention windows as upstream sums them."""

    num_total_allocated_blocks: int
    num_new_allocated_blocks: int
    num_reused_blocks: int
    num_missed_blocks: int
    kv_cache_hit_rate: float


@dataclass(eq=False, slots=True)
class GenerationSequence:
    """A running request's blocks (``GenerationRequest`` upstream).

    ``cached_tokens`` is the prompt tokens matched at admission, partial matches
    included (``prepopulatedPromptLen``).
    """

    request_id: int
    tokens: list[int]
    prompt_tokens: int
    salt: int | None
    blocks: list[Block]
    decode_priority: int
    decode_duration_s: float | None
    metrics: KvCacheMetrics
    cached_tokens: int
    onboarded_blocks: int
    reserved_blocks: int


@dataclass(slots=True)
class FakeCounters:
    """Ground truth the real engine does not report (for the bench and tests)."""

    reused_gpu_blocks: int = 0
    onboarded_blocks: int = 0
    missed_blocks: int = 0
    partial_reused_blocks: int = 0
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
    ``remove_sequence`` at the end, ``flush_iteration_events`` once per iteration;
    ``get_latest_events`` flushes and drains the ring.
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
        self._root = Block(-1, in_tree=True)
        self._tree: dict[int, Block] = {}  # hash -> block in the tree
        self._sequences: dict[int, GenerationSequence] = {}
        self._reserved = 0
        self._ids = 0
        self._seq = 0
        self._event_id = 0
        self._iteration: list[dict[str, Any]] = []  # events of the current iteration
        self._late_removed: dict[int, list[int]] = {}  # window -> hashes (late_removals)
        self._events: deque[dict[str, Any]] = deque()  # the flushed ring
        self.counters = FakeCounters()
        for window in config.window_sizes:
            self._enqueue(
                {"type": "created", "num_blocks_per_cache_level": list(self.num_blocks)}, window
            )

    # -- events -----------------------------------------------------------------------

    def _emit(self, data: dict[str, Any]) -> None:
        """Queue one event for every attention window (copies for the extra ones)."""
        if self.config.event_buffer_max_size == 0:
            return
        for window in self.config.window_sizes:
            event = dict(data)
            if data["type"] == "removed":
                event["block_hashes"] = list(data["block_hashes"])  # extended in place
                self._enqueue_removed(event, window)
            else:
                self._enqueue(event, window)

    def _enqueue_removed(self, data: dict[str, Any], window: int) -> None:
        if self.config.late_removals:
            self._late_removed.setdefault(window, []).extend(data["block_hashes"])
            return
        last = self._iteration[-1] if self._iteration else None
        if last and last["window_size"] == window and last["data"]["type"] == "removed":
            last["data"]["block_hashes"].extend(data["block_hashes"])
        else:
            self._enqueue(data, window)

    def _enqueue(self, data: dict[str, Any], window: int) -> None:
        self._iteration.append({"event_id": self._event_id, "data": data, "window_size": window})
        self._event_id += 1

    def flush_iteration_events(self) -> None:
        """End an iteration: move its events into the ring (``flushIterationEvents``).

        With ``late_removals`` the iteration's removes come last, one event per window.
        Mutates: the ring (dropping its oldest events on overflow).
        """
        for window, hashes in self._late_removed.items():
            self._enqueue({"type": "removed", "block_hashes": hashes}, window)
        self._late_removed.clear()
        size = self.config.event_buffer_max_size
        dropped = 0
        for event in self._iteration:
            if len(self._events) >= size:
                self._events.popleft()
                dropped += 1
            self._events.append(event)
        self._iteration.clear()
        if dropped:
            self.counters.events_dropped += dropped
            log.warning("The event queue has reached the max size of %d; dropping the oldest", size)

    def get_latest_events(self) -> list[dict[str, Any]]:
        """Flush the current iteration, then drain and return the ring, oldest first."""
        self.flush_iteration_events()
        out = list(self._events)
        self._events.clear()
        return out

    @property
    def pending_events(self) -> int:
        """Events flushed to the ring and not yet drained."""
        return len(self._events)

    # -- queries ----------------------------------------------------------------------

    def free_blocks(self, level: int) -> int:
        """Blocks of ``level`` holding nothing."""
        return self.num_blocks[level] - self._used[level]

    def reusable_blocks(self, level: int) -> int:
        """Blocks of ``level`` in the tree with no reference (evictable, eventually)."""
        return self._free_count[level]

    def lookup(self, h: int) -> Block | None:
        """The block with hash ``h`` in the tree, if any. Does not modify the manager."""
        return self._tree.get(h)

    def blocks_needed(self, prompt_tokens: int, max_new_tokens: int) -> int:
        return math.ceil((prompt_tokens + max_new_tokens) / self.tokens_per_block)

    def can_add(self, prompt_token_ids: Sequence[int], max_new_tokens: int, salt: str = "") -> bool:
        """Whether a request fits now with every block reserved (GUARANTEED_NO_EVICT).

        Counts only exact full-block matches on GPU as held (a partial match may need a
        copy). Does not modify the manager.
        """
        held = claimed_free = 0
        node = self._root
        for key in self._keys(prompt_token_ids, cache_salt_id(salt), partial=False):
            child = node.children.get(key)
            if child is None:
                break
            if child.level == GPU:
                held += 1
                claimed_free += child.ref_count == 0
            node = child
        need = self.blocks_needed(len(prompt_token_ids), max_new_tokens) - held
        available = self.free_blocks(GPU) + self.reusable_blocks(GPU) - claimed_free
        return need <= available - self._reserved

    def _keys(self, tokens: Sequence[int], salt: int | None, *, partial: bool) -> list[Key]:
        """Block keys of ``tokens`` minus the last one (``chopVectorIntoBlocks``)."""
        bs = self.tokens_per_block
        usable = len(tokens) - 1
        end = usable if partial else usable - usable % bs
        return [(salt, tuple(tokens[i : min(i + bs, end)])) for i in range(0, max(end, 0), bs)]

    # -- admission ----------------------------------------------------------------------

    def add_sequence(
        self,
        request_id: int,
        prompt_token_ids: Sequence[int],
        max_new_tokens: int,
        retention: Any = None,
        cache_salt: str = "",
    ) -> GenerationSequence:
        """Match, claim, onboard and allocate the prompt's blocks (``addSequence``).

        Args:
            retention: a ``KvCacheRetentionConfig`` (real or stand-in) or ``None``.

        Raises:
            ValueError: a duplicate request id, or a request that cannot fit.

        Mutates: the tree, free queues, events.
        """
        if request_id in self._sequences:
            raise ValueError(f"request {request_id} already has a sequence")
        if not self.can_add(prompt_token_ids, max_new_tokens, cache_salt):
            raise ValueError(f"request {request_id} does not fit in the GPU pool now")
        bs = self.tokens_per_block
        prompt = list(prompt_token_ids)
        salt = cache_salt_id(cache_salt)
        keys = self._keys(prompt, salt, partial=True)
        if len(prompt) % bs == 1:
            keys.append((salt, ()))  # the last token starts a block of its own
        n_blocks = math.ceil(len(prompt) / bs)
        per_block = per_block_retention(retention, bs, n_blocks)
        blocks, matched_tokens, onboarded, partial = self._match(keys, per_block)
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
        c.partial_reused_blocks += partial
        w = len(self.config.window_sizes)  # upstream sums every window's counters
        metrics = KvCacheMetrics(
            w * n_blocks, w * missed, w * reused, w * missed, reused / n_blocks
        )
        seq = GenerationSequence(
            request_id,
            prompt,
            len(prompt),
            salt,
            blocks,
            getattr(retention, "decode_retention_priority", DEFAULT_PRIORITY),
            _seconds(getattr(retention, "decode_duration_ms", None)),
            metrics,
            matched_tokens,
            onboarded,
            reserved_blocks=total,
        )
        self._sequences[request_id] = seq
        return seq

    def _match(
        self, keys: list[Key], per_block: list[tuple[int | None, float | None]]
    ) -> tuple[list[Block], int, int, int]:
        """Claim the tree's blocks matching ``keys`` (``loadOrAllocateBlocks``' hits).

        Returns:
            The claimed blocks, the tokens they match, how many were onboarded, and
            whether the last one was a partial match (0 or 1).
        """
        blocks: list[Block] = []
        matched = onboarded = 0
        node = self._root
        for i, key in enumerate(keys):
            hit = self._find(node, key)
            if hit is None:
                break
            is_partial, n_tokens, block = hit
            matched += n_tokens
            priority, duration_s = per_block[i]
            if priority is not None and block.priority != priority:
                self._emit(_updated(block.hash, None, (block.priority, priority)))
            if is_partial and (block.ref_count > 0 or not block.leaf):
                block = self._allocate(block.priority, block.duration_s)  # a copy
            else:
                self._claim(block, priority, duration_s)
                if is_partial:
                    self._unlink(block)  # freeLeafBlock: leaves the tree, no event
                onboarded += self._onboard(block)
            blocks.append(block)
            if is_partial:
                return blocks, matched, onboarded, 1
            node = block
        return blocks, matched, onboarded, 0

    def _find(self, node: Block, key: Key) -> tuple[bool, int, Block] | None:
        """``KVCacheBlock::findMatchingBlock``: ``(partial, tokens matched, block)``."""
        salt, tokens = key
        if not tokens or not node.children:
            return None
        exact = node.children.get(key)
        if exact is not None:
            return len(exact.tokens) < self.tokens_per_block, len(tokens), exact
        if not self.config.enable_partial_reuse:
            return None
        best, best_n = None, 0
        for (child_salt, child_tokens), child in node.children.items():
            if child_salt != salt:
                continue
            if not self.config.copy_on_partial_reuse and (child.ref_count or not child.leaf):
                continue
            n = _common_prefix(child_tokens, tokens)
            if n > best_n:
                best, best_n = child, n
        return None if best is None else (True, best_n, best)

    def _claim(self, b: Block, priority: int | None, duration_s: float | None) -> None:
        """Take a reference on a block; set its priority if given; always replace its
        duration (``evictionPolicy.cpp::claimBlock``)."""
        if b.ref_count == 0 and b.in_tree:
            self._free_count[b.level] -= 1
        b.ref_count += 1
        if priority is not None:
            b.priority = priority
        b.duration_s = duration_s
        b.expiry_s = None

    def _onboard(self, b: Block) -> int:
        """Bring a host block to GPU (``WindowBlockManager::onboardBlock``); 1 if it moved."""
        if b.level != HOST or not self.config.onboard_blocks:
            return 0
        self._take(GPU)
        self._used[HOST] -= 1
        self._move(b, GPU)
        self._emit(_updated(b.hash, (HOST, GPU), None))
        return 1

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
        if b is not self._root and b.free and b.leaf:
            heapq.heappush(self._heaps[b.level], (b.priority, b.release_seq, b.block_id, b))

    def _move(self, b: Block, level: int) -> None:
        """Change ``b``'s cache level, keeping its parent's per-level child counts."""
        old = b.level
        b.level = level
        if b.free:
            self._free_count[old] -= 1
            self._free_count[level] += 1
        parent = b.parent
        if parent is not None and b.in_tree:
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
        """Remove ``b`` and its whole subtree from the tree, children first
        (``freeChildren``)."""
        removed: list[int] = []
        self._drop_subtree(b, removed)
        evicted_from_host = int(b.level == HOST)
        self.counters.host_evicted_blocks += evicted_from_host
        self.counters.dropped_blocks += len(removed) - evicted_from_host
        self._emit({"type": "removed", "block_hashes": removed})

    def _drop_subtree(self, node: Block, removed: list[int]) -> None:
        for child in list(node.children.values()):
            self._drop_subtree(child, removed)
        assert node.ref_count == 0 and node.in_tree
        self._free_count[node.level] -= 1
        self._used[node.level] -= 1
        removed.append(node.hash)
        self._unlink(node)

    def _unlink(self, b: Block) -> None:
        """Take ``b`` out of the tree (its children must be gone or follow)."""
        parent = b.parent
        assert parent is not None
        del parent.children[b.key]
        parent.level_children[b.level] -= 1
        self._push(parent)
        if self._tree.get(b.hash) is b:
            del self._tree[b.hash]
        b.in_tree = False
        b.parent = None

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
        """Store the prompt's full blocks (minus its last token) after prefill
        (``KVCacheManager::storeContextBlocks``; ``stored`` event)."""
        seq = self._sequences[request_id]
        self._store(seq, self._keys(seq.tokens[: seq.prompt_tokens], seq.salt, partial=False))

    def add_token(self, request_id: int, token_id: int) -> None:
        """Append one generated token, taking a decode block at each block boundary."""
        seq = self._sequences[request_id]
        seq.tokens.append(token_id)
        if len(seq.tokens) > len(seq.blocks) * self.tokens_per_block:
            if len(seq.blocks) < seq.reserved_blocks:
                self._reserved -= 1
            seq.blocks.append(self._allocate(seq.decode_priority, seq.decode_duration_s))

    def remove_sequence(self, request_id: int) -> KvCacheMetrics:
        """Store every block, the trailing partial one included, then release them last
        first (``WindowBlockManager::releaseBlocks``).

        Returns:
            The request's KV-cache metrics.
        """
        seq = self._sequences.pop(request_id)
        self._store(seq, self._keys(seq.tokens, seq.salt, partial=True))
        self._reserved -= max(0, seq.reserved_blocks - len(seq.blocks))  # the unused promise
        for b in reversed(seq.blocks):
            self._release(b)
        return seq.metrics

    def _store(self, seq: GenerationSequence, keys: list[Key]) -> None:
        """Insert the sequence's blocks for ``keys`` into the tree (``storeBlocks``).

        Walks the tree while keys match; from the first miss on, inserts the sequence's
        own blocks (a block matched by another request's stays private and is freed at
        release). One ``stored`` event for the inserted blocks.
        """
        node, matching = self._root, True
        stored: list[Block] = []
        for key, b in zip(keys, seq.blocks, strict=False):
            if matching:
                hit = node.children.get(key)
                if hit is not None:
                    node = hit
                    continue
                matching = False
            b.salt, b.tokens = key
            b.hash = block_key_hash(b.tokens, node.hash, b.salt)
            b.parent, b.in_tree = node, True
            node.children[key] = b
            node.level_children[b.level] += 1
            self._tree[b.hash] = b
            stored.append(b)
            node = b
        if stored:
            parent = stored[0].parent
            self._emit(
                {
                    "type": "stored",
                    "parent_hash": None if parent is self._root or parent is None else parent.hash,
                    "blocks": [_stored_block(b) for b in stored],
                }
            )

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


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _seconds(duration: Any) -> float | None:
    if duration is None:
        return None
    return (
        duration.total_seconds() if hasattr(duration, "total_seconds") else float(duration) / 1000
    )


def _diff(old: int, new: int) -> dict[str, Any]:
    return {"type": "event_diff", "old_value": old, "new_value": new}


def _updated(
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


def _stored_block(b: Block) -> dict[str, Any]:
    return {
        "type": "stored_block",
        "block_hash": b.hash,
        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in b.tokens],
        "cache_level": b.level,
        "priority": b.priority,
    }
