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
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pbkv.kvmanager.blocks import BlockPool
from pbkv.kvmanager.eviction import EvictionIndex, Priority
from pbkv.kvmanager.node import Node, Tier

HOST_TIERS = ("exclusive", "write-through")
"""The host-tier models, named by the system each follows (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class MatchResult:
    """The cached prefix of a key sequence.

    Attributes:
        node: the deepest matched node (the namespace root when nothing matched).
        path: matched nodes from the root's child down to ``node``.
        gpu_blocks: leading matched blocks with a GPU copy.
        host_blocks: matched blocks after those, held only on the host.
    """

    node: Node
    path: tuple[Node, ...]
    gpu_blocks: int
    host_blocks: int

    @property
    def host_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.path if not n.on_gpu)


class Lease:
    """A lock on the path from ``node`` to the root; release it exactly once."""

    __slots__ = ("node", "released")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.released = False


@dataclass(eq=False, slots=True)
class LoadTransfer:
    """An in-flight host-to-GPU copy of ``nodes`` (parent first) into ``gpu_blocks``."""

    nodes: tuple[Node, ...]
    gpu_blocks: tuple[list[int], ...]
    lease: Lease
    prefetch: bool

    @property
    def num_blocks(self) -> int:
        return sum(len(b) for b in self.gpu_blocks)


@dataclass(slots=True)
class TreeCounters:
    """Cumulative block counts of what the tree did (read by the manager's statistics)."""

    evicted_retired_blocks: int = 0
    evicted_active_blocks: int = 0
    demoted_blocks: int = 0
    dropped_blocks: int = 0
    host_evicted_blocks: int = 0
    d2h_blocks: int = 0
    h2d_blocks: int = 0
    prefetch_wasted_blocks: int = 0
    written_through_blocks: int = 0


@dataclass(slots=True)
class TreeHooks:
    """Callbacks into the tree's owners.

    Attributes:
        on_split / on_remove: keep the score board's per-workflow node sets exact.
        on_insert: ``(leaf)``: a new node was added under ``leaf.parent`` (queued
            requests' walks that stopped there may now go further).
        on_demote: ``(node, gpu_blocks, host_blocks)``: a GPU copy is being copied into
            newly allocated host blocks (demoted, or written through); an owned-cache
            engine copies device → host here. Called before the GPU blocks may be freed:
            they may be reallocated as soon as it returns, so the copy must be done, or
            ordered before any reuse, by then. Not called when the node already has a
            host copy, nor when it is dropped.
    """

    on_split: Callable[[Node, Node], None] = lambda old, top: None
    on_remove: Callable[[Node], None] = lambda node: None
    on_insert: Callable[[Node], None] = lambda leaf: None
    on_demote: Callable[[Node, list[int], list[int]], None] = lambda node, gpu, host: None


class RadixTree:
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

    def __init__(
        self,
        *,
        block_size: int,
        gpu_capacity_blocks: int,
        host_capacity_blocks: int,
        priority: Callable[[Node], Priority],
        clock: Callable[[], float],
        host_tier: str = "exclusive",
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        if host_tier not in HOST_TIERS:
            raise ValueError(f"unknown host tier {host_tier!r}; known: {', '.join(HOST_TIERS)}")
        self.write_through = host_tier == "write-through"
        self.block_size = block_size
        self.gpu = BlockPool(gpu_capacity_blocks)
        self.host = BlockPool(host_capacity_blocks)
        self.clock = clock
        self.counters = TreeCounters()
        self.hooks = TreeHooks()
        self._serial = itertools.count(1)
        self._roots: dict[str, Node] = {}
        self._private = {"gpu": 0, "host": 0}
        self._cached = {"gpu": 0, "host": 0}
        self._leases: set[Lease] = set()
        self._leased = {"gpu": 0, "host": 0}  # blocks of nodes with lock_count > 0
        self._loads: dict[int, LoadTransfer] = {}
        self._priority = priority
        self._index = {
            "gpu": EvictionIndex(priority, self._gpu_candidate),
            "host": EvictionIndex(priority, self._host_candidate),
        }
        self.version = 0
        """Bumped by every call that may change what a match, lease, allocation or
        eviction would do (shape, residency, leases, pools, eviction keys): equal
        versions mean an unchanged tree, so a caller may reuse what it decided from it.
        Read-only for callers."""

    # -- queries ---------------------------------------------------------------

    def root(self, namespace: str = "") -> Node:
        """Return the root of ``namespace``, creating it on first use."""
        node = self._roots.get(namespace)
        if node is None:
            self.version += 1
            node = self._roots[namespace] = Node([], None, namespace, next(self._serial))
        return node

    def cached_blocks(self, tier: Tier) -> int:
        return self._cached[tier]

    def private_blocks(self, tier: Tier) -> int:
        return self._private[tier]

    def nodes(self) -> list[Node]:
        """Return every non-root node (depth-first). Does not modify the tree."""
        out: list[Node] = []
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            if not node.is_root:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def lease_count(self) -> int:
        """Return the live leases (requests and copies holding nodes). Does not modify."""
        return len(self._leases)

    def leased_blocks(self, tier: Tier) -> int:
        """Return the blocks of ``tier`` held by leased nodes (not evictable now).

        A running count, kept by :meth:`lock`, :meth:`unlock` and every change of a
        leased node's copies; :meth:`check_integrity` checks it against
        :meth:`_walk_leased_blocks`.
        """
        return self._leased[tier]

    def _walk_leased_blocks(self, tier: Tier) -> int:
        """Return :meth:`leased_blocks` by walking every lease's path to its root."""
        seen: set[int] = set()
        total = 0
        for lease in self._leases:
            walk: Node | None = lease.node
            while walk is not None and not walk.is_root and walk.serial not in seen:
                seen.add(walk.serial)
                blocks = _blocks(walk, tier)
                total += len(blocks) if blocks is not None else 0
                walk = walk.parent
        return total

    def load_of(self, node: Node) -> LoadTransfer | None:
        """Return the in-flight load that will bring ``node`` to the GPU, if any."""
        return self._loads.get(node.serial)

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

    # -- leases ----------------------------------------------------------------

    def lock(self, node: Node) -> Lease:
        """Lease the path from ``node`` to its root. Mutates lock counts."""
        self.version += 1
        lease = Lease(node)
        self._leases.add(lease)
        walk: Node | None = node
        while walk is not None:
            walk.lock_count += 1
            if walk.lock_count == 1:
                self._count_leased(walk, +1)
            walk = walk.parent
        return lease

    def unlock(self, lease: Lease) -> None:
        """Release a lease; nodes that become unleased return to the eviction order.

        Raises:
            ValueError: the lease was already released.
        """
        if lease.released:
            raise ValueError("lease released twice")
        self.version += 1
        lease.released = True
        self._leases.discard(lease)
        walk: Node | None = lease.node
        while walk is not None:
            walk.lock_count -= 1
            if walk.lock_count == 0 and not walk.is_root:
                self._count_leased(walk, -1)
                self.reprioritize(walk)
            walk = walk.parent

    def _count_leased(self, node: Node, sign: int) -> None:
        """Add (``+1``) or take out (``-1``) ``node``'s copies from the leased counts."""
        if node.gpu_blocks is not None:
            self._leased["gpu"] += sign * len(node.gpu_blocks)
        if node.host_blocks is not None:
            self._leased["host"] += sign * len(node.host_blocks)

    # -- private blocks ---------------------------------------------------------

    def can_allocate(self, tier: Tier, n: int) -> bool:
        return self._pool(tier).can_allocate(n)

    def allocate_private(self, tier: Tier, n: int) -> list[int]:
        """Take ``n`` free blocks for a request or transfer (not cached yet).

        Raises:
            ValueError: fewer than ``n`` blocks are free; evict first.
        """
        blocks = self._pool(tier).allocate(n)
        self.version += 1
        self._private[tier] += n
        return blocks

    def free_private(self, tier: Tier, blocks: list[int]) -> None:
        """Return private blocks to the free list. Mutates the pool."""
        self.version += 1
        self._private[tier] -= len(blocks)
        self._pool(tier).free(blocks)

    # -- insertion ---------------------------------------------------------------

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
        _count_child(node, "gpu", +1)
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
        _count_child(leaf, "gpu", +1)
        self.hooks.on_insert(leaf)
        return leaf

    def split(self, node: Node, at: int) -> Node:
        """Split ``node`` after ``at`` blocks and return the new upper node.

        The lower part keeps ``node``'s identity (and its leases); the upper part copies
        its residency, locks, accessors, score and flags.

        Mutates: the tree's shape only (no residency or count changes).
        """
        parent = node.parent
        assert parent is not None and 0 < at < node.num_blocks
        self.version += 1
        top = Node(node.keys[:at], parent, node.namespace, next(self._serial))
        node.keys = node.keys[at:]
        if node.gpu_blocks is not None:
            top.gpu_blocks, node.gpu_blocks = node.gpu_blocks[:at], node.gpu_blocks[at:]
        if node.host_blocks is not None:
            top.host_blocks, node.host_blocks = node.host_blocks[:at], node.host_blocks[at:]
        top.gpu_children, top.host_children = int(node.on_gpu), int(node.on_host)
        top.lock_count = node.lock_count
        top.last_access_s = node.last_access_s
        top.accessors = {w: set(agents) for w, agents in node.accessors.items()}
        top.retired = node.retired
        top.score = node.score
        top.loading = node.loading
        top.prefetched = node.prefetched
        top.fixed_agents = set(node.fixed_agents)
        top.hint = node.hint
        top.queued = node.queued
        top.oldest = node.oldest
        parent.children[top.keys[0]] = top
        top.children[node.keys[0]] = node
        node.parent = top
        load = self._loads.get(node.serial)
        if load is not None:
            self._split_load(load, node, top, at)
        self.hooks.on_split(node, top)
        self.reprioritize(top)
        return top

    def _split_load(self, load: LoadTransfer, node: Node, top: Node, at: int) -> None:
        i = load.nodes.index(node)
        blocks = load.gpu_blocks[i]
        load.nodes = load.nodes[:i] + (top, node) + load.nodes[i + 1 :]
        load.gpu_blocks = (
            load.gpu_blocks[:i] + (blocks[:at], blocks[at:]) + load.gpu_blocks[i + 1 :]
        )
        self._loads[top.serial] = load

    # -- eviction ----------------------------------------------------------------

    def evict(
        self,
        tier: Tier,
        num_blocks: int,
        *,
        retired_only: bool = False,
        below: Priority | None = None,
    ) -> int:
        """Free at least ``num_blocks`` blocks of ``tier`` in the policy's order.

        A node larger than the remaining need is split and only its tail evicted.

        Args:
            tier: ``gpu`` (demote or drop) or ``host`` (drop the host copy).
            num_blocks: blocks wanted.
            retired_only: stop at the first candidate that is not retired (for
                conservative prefetch, which never displaces active cache).
            below: stop at the first candidate whose priority is not below this (a
                demotion never pushes out host cache the policy ranks higher).

        Returns:
            Blocks actually freed (less than asked when every other block is leased).

        Mutates: the tree, both pools, the counters.
        """
        self.version += 1
        freed = 0
        index = self._index[tier]
        while freed < num_blocks:
            node = index.pop_min()
            if node is None:
                break
            if (retired_only and not node.retired) or (
                below is not None and self._priority(node) >= below
            ):
                index.update(node)
                break
            need = num_blocks - freed
            if node.num_blocks > need:
                self.split(node, node.num_blocks - need)
            freed += self._evict_gpu(node) if tier == "gpu" else self._evict_host(node)
        return freed

    def lowest_candidate(self, tier: Tier) -> Node | None:
        """Return the node :meth:`evict` would take first from ``tier`` (``None``: none).

        Mutates: nothing the caller can observe (stale index entries are dropped).
        """
        return self._index[tier].peek_min()

    def _evict_gpu(self, node: Node) -> int:
        blocks = node.gpu_blocks
        assert blocks is not None
        n = len(blocks)
        if node.retired:
            self.counters.evicted_retired_blocks += n
        else:
            self.counters.evicted_active_blocks += n
        if node.prefetched:
            self.counters.prefetch_wasted_blocks += n
            node.prefetched = False
        if not node.on_host and not self.write_through:
            self._copy_to_host(node)
        if node.on_host:
            self.counters.demoted_blocks += n
            self._release(node, "gpu")
            self._index["host"].update(node)
        else:
            self._drop(node)
        return n

    def _copy_to_host(self, node: Node) -> bool:
        """Give GPU-resident ``node`` a host copy if the host has (or can make) room below
        its priority; return whether it has one now."""
        blocks = node.gpu_blocks
        assert blocks is not None
        n = len(blocks)
        if not self._make_host_room(n, self._priority(node)):
            return False
        node.host_blocks = self.host.allocate(n)
        _count_child(node, "host", +1)
        self._cached["host"] += n
        if node.lock_count:
            self._leased["host"] += n
        self.counters.d2h_blocks += n
        self.hooks.on_demote(node, blocks, node.host_blocks)
        return True

    def _write_through(self, node: Node) -> None:
        """Write a newly stored GPU node through to the host (HiCache ``write_backup``)."""
        if node.host_blocks is None and self.host.capacity_blocks and self._copy_to_host(node):
            self.counters.written_through_blocks += node.num_blocks

    def _make_host_room(self, n: int, ceiling: Priority) -> bool:
        if self.host.capacity_blocks < n:
            return False
        short = n - self.host.num_free
        if short > 0:
            self.evict("host", short, below=ceiling)
        return self.host.can_allocate(n)

    def _evict_host(self, node: Node) -> int:
        n = node.num_blocks
        self.counters.host_evicted_blocks += n
        if node.on_gpu:
            self._release(node, "host")
            self._index["gpu"].update(node)
        else:
            self._drop(node)
        return n

    def _release(self, node: Node, tier: Tier) -> None:
        blocks = node.gpu_blocks if tier == "gpu" else node.host_blocks
        assert blocks is not None
        self._pool(tier).free(blocks)
        self._cached[tier] -= len(blocks)
        if node.lock_count:
            self._leased[tier] -= len(blocks)
        if tier == "gpu":
            node.gpu_blocks = None
        else:
            node.host_blocks = None
        _count_child(node, tier, -1)
        self._index[tier].remove(node)
        if node.parent is not None and not node.parent.is_root:
            self._index[tier].update(node.parent)

    def _drop(self, node: Node) -> None:
        """Remove ``node`` and its subtree from the tree, freeing every copy."""
        parent = node.parent
        assert parent is not None and node.lock_count == 0
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            for tier in ("gpu", "host"):
                blocks = n.gpu_blocks if tier == "gpu" else n.host_blocks
                if blocks is not None:
                    self.counters.dropped_blocks += len(blocks)
                    self._release(n, tier)
            self._index["gpu"].remove(n)
            self._index["host"].remove(n)
            self.hooks.on_remove(n)
        del parent.children[node.keys[0]]
        if not parent.is_root:
            self.reprioritize(parent)

    def discard_copy(self, node: Node, tier: Tier) -> None:
        """Forget ``node``'s copy in ``tier`` because its data never landed (a failed copy).

        A node left with no copy in any tier is removed with its subtree, so nothing is
        matched past it.

        Raises:
            ValueError: the node is leased.

        Mutates: the tree and the tier's pool.
        """
        if node.lock_count:
            raise ValueError(f"cannot discard a copy of leased {node}")
        self.version += 1
        if _blocks(node, tier) is not None:
            self._release(node, tier)
        if not node.on_gpu and not node.on_host and node.parent is not None:
            self._drop(node)

    # -- host-to-GPU loads ---------------------------------------------------------

    def begin_load(self, nodes: list[Node], *, prefetch: bool = False) -> LoadTransfer:
        """Start copying host-only ``nodes`` (a chain, parent first) to the GPU.

        Allocates their GPU blocks (the caller evicts first) and leases the chain
        until :meth:`complete_load`.

        Raises:
            ValueError: a node is on the GPU, not on the host, already loading, or the
                chain does not hang below a GPU-resident (or loading) node.
        """
        for i, node in enumerate(nodes):
            if node.on_gpu or not node.on_host or node.loading:
                raise ValueError(f"cannot load {node}: needs a host-only node not in flight")
            parent = node.parent
            expected = nodes[i - 1] if i else None
            if expected is not None and parent is not expected:
                raise ValueError("load chain must be parent-first and contiguous")
            if expected is None and not (
                parent is None or parent.is_root or parent.on_gpu or parent.loading
            ):
                raise ValueError(f"cannot load {node}: its parent is not on the GPU")
        self.version += 1
        blocks = tuple(self.pool_allocate_gpu(n.num_blocks) for n in nodes)
        load = LoadTransfer(tuple(nodes), blocks, self.lock(nodes[-1]), prefetch)
        for node in nodes:
            node.loading = True
            self._loads[node.serial] = load
        return load

    def pool_allocate_gpu(self, n: int) -> list[int]:
        return self.allocate_private("gpu", n)

    def complete_load(self, load: LoadTransfer, *, ok: bool) -> None:
        """Finish a load: on success the nodes become ``gpu+host``; on failure nothing
        becomes resident and the destination blocks are freed (as they are for a node
        that adopted a computed copy while the load was in flight).

        A chain whose parent is not on the GPU when it lands (the parent's load failed)
        fails as well, so no gap is ever made resident.
        """
        self.version += 1
        first_parent = load.nodes[0].parent
        if ok and first_parent is not None and not first_parent.is_root and not first_parent.on_gpu:
            # the parent's own load failed (or has not landed): marking this chain resident
            # would leave a gap, so it fails too and is reloaded or recomputed later
            ok = False
        for node, blocks in zip(load.nodes, load.gpu_blocks, strict=True):
            node.loading = False
            del self._loads[node.serial]
            if ok and not node.on_gpu:
                node.gpu_blocks = blocks
                if node.lock_count:
                    self._leased["gpu"] += len(blocks)
                _count_child(node, "gpu", +1)
                self._private["gpu"] -= len(blocks)
                self._cached["gpu"] += len(blocks)
                node.prefetched = load.prefetch
                self.counters.h2d_blocks += len(blocks)
                self.reprioritize(node)
            else:  # failed, or a computed copy was adopted while in flight (insert)
                self.free_private("gpu", blocks)
        self.unlock(load.lease)

    # -- priorities ----------------------------------------------------------------

    def reprioritize(self, node: Node) -> None:
        """Re-key ``node`` in the eviction order of each tier where it is a candidate.

        A node that is not a candidate there now (leased, or with a resident child in
        the tier) is skipped: whatever makes it one again (:meth:`unlock` reaching zero,
        its last resident child leaving in :meth:`_release` or :meth:`_drop`) re-keys it
        then, so the index never ranks a candidate by a stale key. Most of a workflow's
        nodes are inner nodes of its growing context chain, so most score refreshes
        stop here.
        """
        self.version += 1
        if node.lock_count:
            return
        if node.gpu_blocks is not None and not node.gpu_children:
            self._index["gpu"].update(node)
        if node.host_blocks is not None and not node.host_children:
            self._index["host"].update(node)

    def shift_scores(self, moves: Iterable[tuple[float, Iterable[Node]]]) -> None:
        """Add each move's ``delta`` to the score of each node of its group and
        :meth:`reprioritize` the node, in one pass: a score refresh's moves
        (:meth:`ScoreBoard.set_forecast`, which computes them) in one call.

        Mutates: ``node.score`` of the moves' nodes, the eviction order.
        """
        self.version += 1
        gpu, host = self._index["gpu"].update, self._index["host"].update
        for delta, group in moves:
            for node in group:
                node.score += delta
                # the tests that fail first for most nodes come first: an inner node of a
                # context chain has a resident child on the GPU, and no host copy
                if not node.gpu_children and node.gpu_blocks is not None and not node.lock_count:
                    gpu(node)
                if node.host_blocks is not None and not node.host_children and not node.lock_count:
                    host(node)

    def _gpu_candidate(self, node: Node) -> bool:
        # on_gpu, unleased, not has_child_on("gpu"), read as attributes (the index asks
        # on every pop)
        return node.gpu_blocks is not None and node.lock_count == 0 and not node.gpu_children

    def _host_candidate(self, node: Node) -> bool:
        # write-through: only blocks no longer on the GPU leave the host (HiCache evict_host)
        return (
            node.host_blocks is not None
            and node.lock_count == 0
            and not node.host_children
            and not (self.write_through and node.gpu_blocks is not None)
        )

    def _pool(self, tier: Tier) -> BlockPool:
        return self.gpu if tier == "gpu" else self.host

    # -- invariants ------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Assert the §5.1 invariants; raise ``AssertionError`` with the numbers if broken."""
        nodes = self.nodes()
        expected_locks: dict[int, int] = {}
        for lease in self._leases:
            walk: Node | None = lease.node
            while walk is not None:
                expected_locks[walk.serial] = expected_locks.get(walk.serial, 0) + 1
                walk = walk.parent
        for tier in ("gpu", "host"):
            pool = self._pool(tier)  # type: ignore[arg-type]
            owned = [b for n in nodes for b in (_blocks(n, tier) or [])]
            if len(owned) != len(set(owned)):
                raise AssertionError(f"{tier}: a block is owned by two nodes")
            if len(owned) != self._cached[tier]:
                raise AssertionError(f"{tier}: cached count {self._cached[tier]} != {len(owned)}")
            walked = self._walk_leased_blocks(tier)  # type: ignore[arg-type]
            if walked != self._leased[tier]:
                raise AssertionError(f"{tier}: leased count {self._leased[tier]} != {walked}")
            total = pool.num_free + self._cached[tier] + self._private[tier]
            if total != pool.capacity_blocks:
                raise AssertionError(
                    f"{tier}: free {pool.num_free} + cached {self._cached[tier]} + private "
                    f"{self._private[tier]} = {total} != capacity {pool.capacity_blocks}"
                )
        for root in self._roots.values():
            if root.lock_count != expected_locks.get(root.serial, 0):
                raise AssertionError(f"root lock {root.lock_count} != live leases")
        for n in nodes:
            _check_node(n, expected_locks.get(n.serial, 0), self._loads)

    def __repr__(self) -> str:
        return (
            f"RadixTree(gpu {self._cached['gpu']}/{self.gpu.capacity_blocks} cached, "
            f"host {self._cached['host']}/{self.host.capacity_blocks} cached)"
        )


def _count_child(node: Node, tier: str, delta: int) -> None:
    """Keep the parent's count of children resident in ``tier`` (see Node.has_child_on)."""
    parent = node.parent
    if parent is None:
        return
    if tier == "gpu":
        parent.gpu_children += delta
    else:
        parent.host_children += delta


def _blocks(node: Node, tier: str) -> list[int] | None:
    return node.gpu_blocks if tier == "gpu" else node.host_blocks


def _check_node(n: Node, expected_lock: int, loads: dict[int, LoadTransfer]) -> None:
    parent = n.parent
    assert parent is not None
    if n.lock_count != expected_lock or n.lock_count < 0:
        raise AssertionError(f"{n}: lock count {n.lock_count} != live leases {expected_lock}")
    if not n.on_gpu and not n.on_host:
        raise AssertionError(f"{n}: in the tree with no copy in any tier")
    if n.on_gpu and not parent.is_root and not parent.on_gpu:
        raise AssertionError(f"{n}: on the GPU below {parent}, which is not (a gap)")
    if parent.children.get(n.keys[0]) is not n:
        raise AssertionError(f"{n}: not filed under its first key in its parent")
    for tier, counted in (("gpu", n.gpu_children), ("host", n.host_children)):
        actual = sum(_blocks(c, tier) is not None for c in n.children.values())
        if counted != actual:
            raise AssertionError(f"{n}: counts {counted} {tier} children, has {actual}")
    for tier in ("gpu", "host"):
        blocks = _blocks(n, tier)
        if blocks is not None and len(blocks) != n.num_blocks:
            raise AssertionError(f"{n}: {len(blocks)} {tier} blocks for {n.num_blocks} keys")
    if n.loading != (n.serial in loads) or (n.loading and n.lock_count == 0):
        raise AssertionError(f"{n}: in-flight load without a lease or record")


def _common_prefix(span: list[int], keys: list[int], start: int) -> int:
    limit = min(len(span), len(keys) - start)
    if span[:limit] == keys[start : start + limit]:  # the common case, compared in C
        return limit
    i = 0
    while i < limit and span[i] == keys[start + i]:
        i += 1
    return i
