"""Block pools: the fixed set of KV block ids of one tier (GPU or host)."""

from __future__ import annotations


class BlockPool:
    """A free list of block ids ``0 .. capacity_blocks-1`` for one tier.

    The free list is lazy: ids never handed out are a range (``_fresh`` up to the
    capacity), and only returned ids are stored, so memory follows the blocks in use,
    not the capacity (a host tier of 10^14 tokens costs nothing until it fills).
    Allocation takes returned ids first, most recent first, then fresh ids in order.

    Args:
        capacity_blocks: number of blocks in the tier, >= 0.

    Raises:
        ValueError: negative capacity.
    """

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._returned: list[int] = []
        self._fresh = 0  # ids >= this were never handed out

    @property
    def num_free(self) -> int:
        return len(self._returned) + self.capacity_blocks - self._fresh

    def can_allocate(self, n: int) -> bool:
        """Return whether ``n`` blocks are free. Does not modify the pool."""
        return n <= self.num_free

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free block ids.

        Mutates: removes them from the free list.

        Raises:
            ValueError: fewer than ``n`` blocks are free (check with :meth:`can_allocate`).
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > self.num_free:
            raise ValueError(f"cannot allocate {n} blocks: {self.num_free} free")
        if n == 0:
            return []
        reused = min(n, len(self._returned))
        taken = self._returned[len(self._returned) - reused :][::-1]
        del self._returned[len(self._returned) - reused :]
        fresh = n - reused
        taken.extend(range(self._fresh, self._fresh + fresh))
        self._fresh += fresh
        return taken

    def free(self, block_ids: list[int]) -> None:
        """Return block ids to the free list. Mutates the pool."""
        self._returned.extend(reversed(block_ids))
