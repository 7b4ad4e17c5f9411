"""The radix tree's state and the primitives every tree operation builds on (§5.1).

:class:`TreeState` holds the two block pools and the running counts that
``check_integrity()`` verifies (cached, private and leased blocks per tier), the
namespace roots, the leases, the in-flight loads and the two eviction indexes. Its
methods are the steps the tree's operations share: leasing a path, taking and returning
private blocks, splitting a node, and re-keying a node in the eviction order. Matching
and insertion (:mod:`~pbkv.kvmanager.radix`), eviction
(:mod:`~pbkv.kvmanager.radix_eviction`), loads (:mod:`~pbkv.kvmanager.radix_loads`) and
the invariant check (:mod:`~pbkv.kvmanager.radix_integrity`) are mixins over it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from pbkv.kvmanager.blocks import BlockPool
from pbkv.kvmanager.eviction import EvictionIndex, Priority
from pbkv.kvmanager.node import Node, Tier
from pbkv.kvmanager.radix_records import HOST_TIERS, Lease, LoadTransfer, TreeCounters, TreeHooks


class TreeState:
    """The state of a :class:`~pbkv.kvmanager.radix.RadixTree` and its shared steps.

    Constructed through :class:`~pbkv.kvmanager.radix.RadixTree`, whose docstring
    gives the arguments and errors.
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
                blocks = tier_blocks(walk, tier)
                total += len(blocks) if blocks is not None else 0
                walk = walk.parent
        return total

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

    def reprioritize(self, node: Node) -> None:
        """Re-key ``node`` in the eviction order of each tier where it is a candidate.

        A node that is not a candidate there now (leased, or with a resident child in
        the tier) is skipped: whatever makes it one again (:meth:`unlock` reaching zero,
        its last resident child leaving in eviction's ``_release`` or ``_drop``) re-keys
        it then, so the index never ranks a candidate by a stale key. Most of a workflow's
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


def count_child(node: Node, tier: str, delta: int) -> None:
    """Keep the parent's count of children resident in ``tier`` (see Node.has_child_on)."""
    parent = node.parent
    if parent is None:
        return
    if tier == "gpu":
        parent.gpu_children += delta
    else:
        parent.host_children += delta


def tier_blocks(node: Node, tier: str) -> list[int] | None:
    """Return ``node``'s block ids in ``tier`` (``None``: no copy there). Does not modify."""
    return node.gpu_blocks if tier == "gpu" else node.host_blocks
