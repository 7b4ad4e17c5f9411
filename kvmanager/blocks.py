"""Block pools: the fixed set of KV block ids of one tier (GPU or host)."""

from __future__ import annotations


class BlockPool:
    """A free list of block ids ``0 .. capacity_blocks-1`` for one tier.

    Args:
        capacity_blocks: number of blocks in the tier, >= 0.

    Raises:
        ValueError: negative capacity.
    """

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._free: list[int] = list(range(capacity_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        """Return whether ``n`` blocks are free. Does not modify the pool."""
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free block ids.

        Mutates: removes them from the free list.

        Raises:
            ValueError: fewer than ``n`` blocks are free (check with :meth:`can_allocate`).
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks: {len(self._free)} free")
        if n == 0:
            return []
        taken = self._free[-n:]
        del self._free[-n:]
        return taken[::-1]

    def free(self, block_ids: list[int]) -> None:
        """Return block ids to the free list. Mutates the pool."""
        self._free.extend(reversed(block_ids))
