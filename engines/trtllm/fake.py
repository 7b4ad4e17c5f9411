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
  the front of the lowest non-empty queue (``evictionPolicy.cpp``; :mod:`.fake_queues`);
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
- events as the engine queues them, flushed once per iteration into a ring that drops
  the oldest on overflow, an iteration's removes last in 1.2.x (:mod:`.fake_events`);
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

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from pbkv.engines.trtllm.api import DEFAULT_PRIORITY
from pbkv.engines.trtllm.blockkey import block_key_hash, cache_salt_id, prompt_block_hashes
from pbkv.engines.trtllm.fake_events import (
    EventQueue,
    created_event,
    removed_event,
    stored_event,
    updated_event,
)
from pbkv.engines.trtllm.fake_queues import FreeQueues
from pbkv.engines.trtllm.fake_records import (
    GPU,
    HOST,
    Block,
    BlockManagerConfig,
    FakeCounters,
    GenerationSequence,
    Key,
    KvCacheMetrics,
    block_hash,
    per_block_retention,
    seconds,
)

log = logging.getLogger(__name__)

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
        self._root = Block(-1, in_tree=True)
        self._queues = FreeQueues(self._root)
        self._tree: dict[int, Block] = {}  # hash -> block in the tree
        self._sequences: dict[int, GenerationSequence] = {}
        self._reserved = 0
        self._ids = 0
        self._seq = 0
        self._events = EventQueue(config)
        self.counters = FakeCounters()
        for window in config.window_sizes:
            self._events.enqueue(created_event(self.num_blocks), window)

    # -- events -----------------------------------------------------------------------

    def flush_iteration_events(self) -> None:
        """End an iteration: move its events into the ring (``flushIterationEvents``).

        With ``late_removals`` the iteration's removes come last, one event per window.
        Mutates: the ring (dropping its oldest events on overflow).
        """
        dropped = self._events.flush()
        if dropped:
            self.counters.events_dropped += dropped
            size = self.config.event_buffer_max_size
            log.warning("The event queue has reached the max size of %d; dropping the oldest", size)

    def get_latest_events(self) -> list[dict[str, Any]]:
        """Flush the current iteration, then drain and return the ring, oldest first."""
        self.flush_iteration_events()
        return self._events.drain()

    @property
    def pending_events(self) -> int:
        """Events flushed to the ring and not yet drained."""
        return self._events.pending

    # -- queries ----------------------------------------------------------------------

    def free_blocks(self, level: int) -> int:
        """Blocks of ``level`` holding nothing."""
        return self.num_blocks[level] - self._used[level]

    def reusable_blocks(self, level: int) -> int:
        """Blocks of ``level`` in the tree with no reference (evictable, eventually)."""
        return self._queues.free[level]

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
            seconds(getattr(retention, "decode_duration_ms", None)),
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
                self._events.emit(updated_event(block.hash, None, (block.priority, priority)))
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
            self._queues.free[b.level] -= 1
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
        self._events.emit(updated_event(b.hash, (HOST, GPU), None))
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
        return self._queues.victim(level, self.clock())

    def _move(self, b: Block, level: int) -> None:
        """Change ``b``'s cache level, keeping its parent's per-level child counts."""
        old = b.level
        b.level = level
        if b.free:
            self._queues.free[old] -= 1
            self._queues.free[level] += 1
        parent = b.parent
        if parent is not None and b.in_tree:
            parent.level_children[old] -= 1
            parent.level_children[level] += 1
            self._queues.push(parent)

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
        self._queues.push(b)
        self.counters.offloaded_blocks += 1
        self._events.emit(updated_event(b.hash, (GPU, HOST), None))

    def _drop(self, b: Block) -> None:
        """Remove ``b`` and its whole subtree from the tree, children first
        (``freeChildren``)."""
        removed: list[int] = []
        self._drop_subtree(b, removed)
        evicted_from_host = int(b.level == HOST)
        self.counters.host_evicted_blocks += evicted_from_host
        self.counters.dropped_blocks += len(removed) - evicted_from_host
        self._events.emit(removed_event(removed))

    def _drop_subtree(self, node: Block, removed: list[int]) -> None:
        for child in list(node.children.values()):
            self._drop_subtree(child, removed)
        assert node.ref_count == 0 and node.in_tree
        self._queues.free[node.level] -= 1
        self._used[node.level] -= 1
        removed.append(node.hash)
        self._unlink(node)

    def _unlink(self, b: Block) -> None:
        """Take ``b`` out of the tree (its children must be gone or follow)."""
        parent = b.parent
        assert parent is not None
        del parent.children[b.key]
        parent.level_children[b.level] -= 1
        self._queues.push(parent)
        if self._tree.get(b.hash) is b:
            del self._tree[b.hash]
        b.in_tree = False
        b.parent = None

    def refresh(self) -> None:
        """Move free blocks whose duration has lapsed back to priority 35."""
        self._queues.refresh(self.clock())

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
            parent_hash = None if parent is self._root or parent is None else parent.hash
            self._events.emit(stored_event(parent_hash, stored))

    def _release(self, b: Block) -> None:
        b.ref_count -= 1
        if b.ref_count > 0:
            return
        if not b.in_tree:
            self._used[b.level] -= 1
            return
        self._seq += 1
        b.release_seq = self._seq
        self._queues.free[b.level] += 1
        if b.duration_s is not None and b.priority != DEFAULT_PRIORITY:
            self._queues.expire_at(b, self.clock() + b.duration_s)
        self._queues.push(b)

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


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
