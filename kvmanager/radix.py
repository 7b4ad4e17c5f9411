"""The radix tree over GPU and host tiers: matching, leases, insertion, eviction, loads (§5.1).

The tree is the allocator of an owned-cache engine: every cached block of either tier
belongs to exactly one node, and every other allocated block is *private* to a request
or transfer. ``check_integrity()`` asserts the invariants of §5.1 with the numbers.

Residency rules kept by construction:

* GPU residency is prefix-closed: a node on the GPU has its parent on the GPU, so a
  match is a run of GPU blocks followed by a run of host-only blocks, never a gap.
* GPU eviction takes only nodes with no GPU child; it *demotes* to the host tier
  (copying if the host holds no copy yet) when the host has room, else drops.
* Host eviction takes only nodes with no host-resident child (the host-leaf rule).
* The host tier follows one of two models (:data:`HOST_TIERS`). ``exclusive``
  (TensorRT-LLM's offload on eviction): a block is copied to the host when the GPU evicts
  it. ``write-through`` (SGLang HiCache's default, ``hicache_write_policy=
  "write_through"``, ``hiradix_cache.py``): a block is copied to the host as it is
  stored on the GPU (when the host has room), GPU eviction keeps the host copy (free) or
  drops a block that has none, and host eviction takes only blocks no longer on the GPU;
  the host's capacity counts the copies.
* A node with no copy in any tier is removed with its subtree, so a partly evicted
  chain is never matched past the gap.
* Leased nodes (requests, in-flight copies) are never evicted; a lease locks the path
  from its node up to the root.

:class:`RadixTree` is assembled from mixins over
:class:`~pbkv.kvmanager.radix_state.TreeState` (pools, counts, leases, splits, eviction
keys): :mod:`~pbkv.kvmanager.radix_eviction`, :mod:`~pbkv.kvmanager.radix_loads` and
:mod:`~pbkv.kvmanager.radix_integrity`. This module holds matching and insertion.
"""

from __future__ import annotations

from pbkv.kvmanager.node import Node
from pbkv.kvmanager.radix_eviction import TreeEviction
from pbkv.kvmanager.radix_integrity import TreeIntegrity
from pbkv.kvmanager.radix_loads import TreeLoads
from pbkv.kvmanager.radix_records import HOST_TIERS, Lease, LoadTransfer, MatchResult, TreeHooks
from pbkv.kvmanager.radix_state import count_child

# the records are re-exported for the modules that import them from here
__all__ = ["HOST_TIERS", "Lease", "LoadTransfer", "MatchResult", "RadixTree", "TreeHooks"]


class RadixTree(TreeEviction, TreeLoads, TreeIntegrity):
    """Block-granular prefix tree of cached KV, over a GPU and a host tier.

    Args:
        block_size: tokens per block.
        gpu_capacity_blocks: blocks in the GPU tier.
        host_capacity_blocks: blocks in the host tier (0 = no host tier: GPU eviction
            drops).
        priority: the eviction policy's key (smallest evicted first), used for both tiers.
        clock: returns the current time in seconds (``runtime.clock.now_s`` in the actor
            shell; any monotonic function in tests).
        host_tier: ``exclusive`` or ``write-through`` (:data:`HOST_TIERS`).

    Raises:
        ValueError: non-positive block size, negative capacity, unknown host tier.
    """

    def match_prefix(self, keys: list[int], namespace: str = "") -> MatchResult:
        """Find the longest cached prefix of ``keys``.

        Mutates: splits a node whose span is only partly matched (no residency change).
        """
        node = self.root(namespace)
        path: list[Node] = []
        i = gpu = 0
        end = len(keys)
        while i < end:
            child = node.children.get(keys[i])
            if child is None:
                break
            span = child.keys
            common = len(span)
            if common > end - i or keys[i : i + common] != span:  # else the whole span
                common = _common_prefix(span, keys, i)  # shorter than the span: split it
                child = self.split(child, common)
            path.append(child)
            if child.gpu_blocks is not None:  # every path node is matched whole
                gpu += common
            node = child
            i += common
        return MatchResult(node, tuple(path), gpu, i - gpu)

    def peek_path(self, keys: list[int], namespace: str = "") -> list[Node]:
        """Return the nodes holding the cached prefix of ``keys`` (the last may hold more).

        Does not modify the tree.
        """
        return self.peek_spans(keys, namespace)[0]

    def peek_spans(self, keys: list[int], namespace: str = "") -> tuple[list[Node], list[int]]:
        """Return :meth:`peek_path`'s nodes and the blocks of ``keys`` matched in each.

        Every span but the last is its node's whole length; the last is shorter when
        ``keys`` diverge inside that node. Does not modify the tree.
        """
        node = self._roots.get(namespace)
        path: list[Node] = []
        spans: list[int] = []
        i = 0
        while node is not None and i < len(keys):
            child = node.children.get(keys[i])
            if child is None:
                break
            path.append(child)
            common = _common_prefix(child.keys, keys, i)
            spans.append(common)
            if common < child.num_blocks:
                break
            node = child
            i += common
        return path, spans

    def peek_prefix(self, keys: list[int], namespace: str = "") -> tuple[int, int]:
        """Return the cached prefix of ``keys`` as (GPU blocks, host-only blocks).

        Like :meth:`match_prefix` but splits nothing: for schedulers ranking queued
        requests. Does not modify the tree (an unknown namespace matches nothing).
        """
        node = self._roots.get(namespace)
        gpu = host = i = 0
        while node is not None and i < len(keys):
            child = node.children.get(keys[i])
            if child is None:
                break
            common = _common_prefix(child.keys, keys, i)
            if child.on_gpu:
                gpu += common
            else:
                host += common
            if common < child.num_blocks:
                break
            node = child
            i += common
        return gpu, host

    def insert(self, keys: list[int], gpu_blocks: list[int], namespace: str = "") -> MatchResult:
        """Cache computed blocks under ``keys``; the tree takes ownership of ``gpu_blocks``.

        ``gpu_blocks`` hold the *last* ``len(gpu_blocks)`` keys; the keys before them
        must already be cached (a request's matched, leased prefix). Blocks already
        cached on the GPU are duplicates and are freed; a host-only node on the path
        adopts the new GPU copy (it becomes ``gpu+host``) when its parent is on the
        GPU, even while a load of it is in flight; the rest becomes a new leaf.

        Args:
            keys: block keys of the whole sequence.
            gpu_blocks: private GPU blocks (see :meth:`allocate_private`) holding the
                computed KV of ``keys[len(keys) - len(gpu_blocks):]``.

        Returns:
            The match of ``keys`` after insertion (``node`` is the deepest node).

        Raises:
            ValueError: more blocks than keys, or a key before the new blocks is not
                cached.
        """
        skip = len(keys) - len(gpu_blocks)
        if skip < 0:
            raise ValueError(f"{len(keys)} keys for {len(gpu_blocks)} blocks")
        self.version += 1
        return self._insert_below(self.root(namespace), [], 0, keys, gpu_blocks, self.clock(), 0)

    def insert_below(self, node: Node, keys: list[int], gpu_blocks: list[int]) -> MatchResult:
        """Do :meth:`insert` for ``keys`` whose cached, leased prefix ends at ``node``.

        The same tree, timestamps, eviction order and result as
        ``insert(keys, gpu_blocks, node.namespace)``, without matching the prefix again:
        a request's chunk commits extend the sequence its lease holds, so each one
        costs the new blocks' walk, not the whole prompt's. The prefix's nodes get
        ``last_access_s`` as :meth:`insert` gives them; their re-keying is skipped
        because a leased node is not a candidate (see :meth:`reprioritize`). Falls back
        to :meth:`insert` unless the path to ``node`` holds exactly the first
        ``len(keys) - len(gpu_blocks)`` keys, all leased and on the GPU.

        Raises / Mutates: as :meth:`insert`.
        """
        skip = len(keys) - len(gpu_blocks)
        prefix: list[Node] = []
        depth = 0
        walk, parent = node, node.parent
        while parent is not None:  # up to the root
            if walk.lock_count == 0 or walk.gpu_blocks is None:
                return self.insert(keys, gpu_blocks, node.namespace)
            prefix.append(walk)
            depth += len(walk.keys)
            walk, parent = parent, parent.parent
        if depth != skip or (depth and node.keys[-1] != keys[depth - 1]):
            return self.insert(keys, gpu_blocks, node.namespace)  # keys chain the prefix
        self.version += 1
        now = self.clock()
        prefix.reverse()
        for walk in prefix:
            walk.last_access_s = now
        return self._insert_below(node, prefix, skip, keys, gpu_blocks, now, depth)

    def _insert_below(
        self,
        node: Node,
        path: list[Node],
        i: int,
        keys: list[int],
        gpu_blocks: list[int],
        now: float,
        gpu: int,
    ) -> MatchResult:
        """Insert ``keys[i:]`` below ``node`` (``path`` leads to it, holding ``i``
        blocks, ``gpu`` of them on the GPU); the walk of :meth:`insert`."""
        skip = len(keys) - len(gpu_blocks)
        known = len(path)
        while i < len(keys):
            child = node.children.get(keys[i])
            fresh = child is None
            if child is None:
                if i < skip:
                    raise ValueError(f"block {i} of the sequence is not cached; cannot skip it")
                child = self._new_leaf(node, keys[i:], gpu_blocks[i - skip :])
                i = len(keys)
            else:
                common = _common_prefix(child.keys, keys, i)
                if i < skip and not child.on_gpu:
                    raise ValueError(f"block {i} of the sequence is not on the GPU; load it first")
                if i < skip < i + common:
                    common = skip - i
                if common < child.num_blocks:
                    child = self.split(child, common)
                if i >= skip:
                    self._adopt_or_free(child, gpu_blocks[i - skip : i - skip + common])
                i += common
            child.last_access_s = now
            self.reprioritize(child)
            if fresh and self.write_through:
                self._write_through(child)
            path.append(child)
            node = child
        gpu += sum(len(n.keys) for n in path[known:] if n.gpu_blocks is not None)
        return MatchResult(node, tuple(path), gpu, i - gpu)

    def _adopt_or_free(self, node: Node, blocks: list[int]) -> None:
        # A node with a load in flight adopts too (the load's copy is discarded when it
        # lands): leaving it host-only would put the rest of the sequence on the GPU
        # below a non-GPU node, a gap.
        parent_on_gpu = node.parent is None or node.parent.is_root or node.parent.on_gpu
        if node.on_gpu or not parent_on_gpu:
            self.free_private("gpu", blocks)
            return
        node.gpu_blocks = list(blocks)
        count_child(node, "gpu", +1)
        self._private["gpu"] -= len(blocks)
        self._cached["gpu"] += len(blocks)
        if node.lock_count:
            self._leased["gpu"] += len(blocks)

    def _new_leaf(self, parent: Node, keys: list[int], gpu_blocks: list[int]) -> Node:
        leaf = Node(list(keys), parent, parent.namespace, next(self._serial))
        leaf.gpu_blocks = list(gpu_blocks)
        self._private["gpu"] -= len(gpu_blocks)
        self._cached["gpu"] += len(gpu_blocks)
        parent.children[keys[0]] = leaf
        count_child(leaf, "gpu", +1)
        self.hooks.on_insert(leaf)
        return leaf

    def __repr__(self) -> str:
        return (
            f"RadixTree(gpu {self._cached['gpu']}/{self.gpu.capacity_blocks} cached, "
            f"host {self._cached['host']}/{self.host.capacity_blocks} cached)"
        )


def _common_prefix(span: list[int], keys: list[int], start: int) -> int:
    limit = min(len(span), len(keys) - start)
    if span[:limit] == keys[start : start + limit]:  # the common case, compared in C
        return limit
    i = 0
    while i < limit and span[i] == keys[start + i]:
        i += 1
    return i
