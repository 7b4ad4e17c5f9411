"""The radix tree's invariant check (§5.1): counts, leases, residency and shape.

``check_integrity()`` recomputes from the nodes what the tree keeps as running counts and
raises ``AssertionError`` with both numbers where they differ.
"""

from __future__ import annotations

from pbkv.kvmanager.node import Node
from pbkv.kvmanager.radix_records import LoadTransfer
from pbkv.kvmanager.radix_state import TreeState, tier_blocks


class TreeIntegrity(TreeState):
    """The invariant check of :class:`~pbkv.kvmanager.radix.RadixTree`."""

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
            owned = [b for n in nodes for b in (tier_blocks(n, tier) or [])]
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
        actual = sum(tier_blocks(c, tier) is not None for c in n.children.values())
        if counted != actual:
            raise AssertionError(f"{n}: counts {counted} {tier} children, has {actual}")
    for tier in ("gpu", "host"):
        blocks = tier_blocks(n, tier)
        if blocks is not None and len(blocks) != n.num_blocks:
            raise AssertionError(f"{n}: {len(blocks)} {tier} blocks for {n.num_blocks} keys")
    if n.loading != (n.serial in loads) or (n.loading and n.lock_count == 0):
        raise AssertionError(f"{n}: in-flight load without a lease or record")
