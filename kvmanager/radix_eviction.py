"""Eviction from the radix tree's tiers: GPU demotion or drop, host drop (§5.1, §5.2).

GPU eviction takes only nodes with no GPU child. Under ``exclusive`` a node with no host
copy gets one when the host has, or can make by evicting cache the policy ranks lower,
room for it; under ``write-through`` a node has a host copy only if it was written
through or loaded from the host. A node with a host copy is *demoted* (still matchable
on the host), any other is dropped. Host eviction takes only nodes with no host-resident
child (and, under ``write-through``, none still on the GPU). A node left with no copy in
any tier is removed with its subtree.
"""

from __future__ import annotations

from pbkv.kvmanager.eviction import Priority
from pbkv.kvmanager.node import Node, Tier
from pbkv.kvmanager.radix_state import TreeState, count_child, tier_blocks


class TreeEviction(TreeState):
    """The eviction half of :class:`~pbkv.kvmanager.radix.RadixTree`."""

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

    def _copy_to_host(self, node: Node, *, ceiling: bool = True) -> bool:
        """Give GPU-resident ``node`` a host copy if the host has (or can make) room, with
        ``ceiling`` only by evicting host cache ranked below ``node``; return whether it
        has one now."""
        blocks = node.gpu_blocks
        assert blocks is not None
        n = len(blocks)
        if not self._make_host_room(n, self._priority(node) if ceiling else None):
            return False
        node.host_blocks = self.host.allocate(n)
        count_child(node, "host", +1)
        self._cached["host"] += n
        if node.lock_count:
            self._leased["host"] += n
        self.counters.d2h_blocks += n
        self.hooks.on_demote(node, blocks, node.host_blocks)
        return True

    def _write_through(self, node: Node) -> None:
        """Write a newly stored GPU node through to the host (HiCache ``write_backup``).

        Every new node is written, the host making room by evicting its lowest-ranked
        host-only cache, as HiCache's host pool does: no ceiling, since the node is also
        on the GPU, and a copy refused here is lost for good once the GPU lets it go (a
        ceiling at the node's own rank refused a young workflow's new context whenever
        older workflows' cache filled the host, and that context was recomputed).
        """
        unwritten = node.host_blocks is None and self.host.capacity_blocks
        if unwritten and self._copy_to_host(node, ceiling=False):
            self.counters.written_through_blocks += node.num_blocks

    def _make_host_room(self, n: int, ceiling: Priority | None) -> bool:
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
        count_child(node, tier, -1)
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
        if tier_blocks(node, tier) is not None:
            self._release(node, tier)
        if not node.on_gpu and not node.on_host and node.parent is not None:
            self._drop(node)
