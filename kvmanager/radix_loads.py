"""Host-to-GPU loads of the radix tree: starting and landing a copy of a host-only chain.

A load allocates the chain's GPU blocks up front and leases the chain until it lands; a
chain lands resident only when its parent is on the GPU by then, so a failed load never
leaves a gap (§5.1).
"""

from __future__ import annotations

from pbkv.kvmanager.node import Node
from pbkv.kvmanager.radix_records import LoadTransfer
from pbkv.kvmanager.radix_state import TreeState, count_child


class TreeLoads(TreeState):
    """The host-to-GPU half of :class:`~pbkv.kvmanager.radix.RadixTree`."""

    def load_of(self, node: Node) -> LoadTransfer | None:
        """Return the in-flight load that will bring ``node`` to the GPU, if any."""
        return self._loads.get(node.serial)

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
                count_child(node, "gpu", +1)
                self._private["gpu"] -= len(blocks)
                self._cached["gpu"] += len(blocks)
                node.prefetched = load.prefetch
                self.counters.h2d_blocks += len(blocks)
                self.reprioritize(node)
            else:  # failed, or a computed copy was adopted while in flight (insert)
                self.free_private("gpu", blocks)
        self.unlock(load.lease)
