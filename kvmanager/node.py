"""Radix-tree nodes: one run of cached blocks and what the policies know about it (§5.1)."""

from __future__ import annotations

from typing import Literal

Tier = Literal["gpu", "host"]

NO_WORKFLOW = 1 << 62
"""``Node.oldest`` of a node no active workflow touched."""


class Node:
    """A span of full blocks shared by every prompt that passes through it.

    Attributes:
        keys: block keys of the span (see :func:`pbkv.kvmanager.keys.block_keys`).
        parent: the node above, ``None`` for a namespace root.
        children: child nodes keyed by their first block key.
        gpu_blocks / host_blocks: block ids of the copy in that tier, ``None`` when the
            tier holds no copy. Residency is ``gpu``, ``host`` or ``gpu+host``.
        lock_count: live leases (requests, transfers) at or below this node.
        last_access_s: clock time of the last match or insert through this node.
        accessors: ``A_w(c)``: for each *active* workflow that touched this node, the
            agents of that workflow that did.
        retired: every workflow that touched the node has terminated.
        score: ``Score(c)`` of paper Eq. 2, kept current by the score board.
        namespace: tenant / cache salt; nodes of different namespaces never meet.
        loading: a host-to-GPU copy of this node is in flight.
        prefetched: the GPU copy came from a prefetch and has not been used yet.
        fixed_agents: agents whose fixed prefix (preamble + role prompt) covers this node
            (KVFlow's fixed-prefix cache; empty for dynamic suffixes).
        hint: a baseline policy's per-node key (KVFlow: steps-to-execution; Belady:
            seconds to next use), kept current by that policy's tracker.
        queued: queued requests whose cached prefix runs through this node (kept by
            :meth:`~pbkv.kvmanager.KVManager.note_waiting`).
        oldest: start ordinal of the oldest active workflow that touched this node
            (:data:`NO_WORKFLOW` when none), kept by the score board.
    """

    __slots__ = (
        "keys",
        "parent",
        "children",
        "gpu_blocks",
        "host_blocks",
        "lock_count",
        "last_access_s",
        "accessors",
        "retired",
        "score",
        "namespace",
        "loading",
        "prefetched",
        "fixed_agents",
        "hint",
        "queued",
        "oldest",
        "gpu_children",
        "host_children",
        "serial",
    )

    def __init__(self, keys: list[int], parent: Node | None, namespace: str, serial: int) -> None:
        self.keys = keys
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.gpu_blocks: list[int] | None = None
        self.host_blocks: list[int] | None = None
        self.lock_count = 0
        self.last_access_s = 0.0
        self.accessors: dict[str, set[str]] = {}
        self.retired = False
        self.score = 0.0
        self.namespace = namespace
        self.loading = False
        self.prefetched = False
        self.fixed_agents: set[str] = set()
        self.hint = 0.0
        self.queued = 0
        self.oldest = NO_WORKFLOW
        self.gpu_children = 0  # children with a copy in that tier (kept by the tree)
        self.host_children = 0
        self.serial = serial

    @property
    def num_blocks(self) -> int:
        return len(self.keys)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def on_gpu(self) -> bool:
        return self.gpu_blocks is not None

    @property
    def on_host(self) -> bool:
        return self.host_blocks is not None

    @property
    def residency(self) -> str:
        tiers = [t for t, on in (("gpu", self.on_gpu), ("host", self.on_host)) if on]
        return "+".join(tiers) or "none"

    def has_child_on(self, tier: Tier) -> bool:
        """Return whether a child holds a copy in ``tier`` (O(1): counts kept by the tree)."""
        return (self.gpu_children if tier == "gpu" else self.host_children) > 0

    def __repr__(self) -> str:
        return (
            f"Node(#{self.serial}, blocks={self.num_blocks}, {self.residency}, "
            f"lock={self.lock_count}, score={self.score:.3g}, retired={self.retired})"
        )
