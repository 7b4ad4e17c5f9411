"""The records the radix tree hands out and reports: matches, leases, loads, counters, hooks.

Plain data shared by :class:`~pbkv.kvmanager.radix.RadixTree` and its owners (the KV
manager, the prefetcher, the baseline trackers); no tree logic lives here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pbkv.kvmanager.node import Node

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
