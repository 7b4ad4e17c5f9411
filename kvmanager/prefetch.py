"""Prefetch planning: which host-only cache to bring back in idle time (§5.4).

Plain synchronous code over the radix tree, run by an engine in pure-decode steps.
"""

from __future__ import annotations

import heapq

from pbkv.kvmanager.kvflow import KVFlowTracker
from pbkv.kvmanager.node import Node
from pbkv.kvmanager.policies import Policy
from pbkv.kvmanager.radix import LoadTransfer, RadixTree
from pbkv.kvmanager.scoring import ScoreBoard


class Prefetcher:
    """Plan a policy's prefetches.

    Modes (``policy.prefetch``): ``conservative`` (§5.4): budget ``S = min(S_a, S_bw)``,
    ``S_a`` free GPU space plus retired cache (the only cache it may displace), ``S_bw``
    the blocks the host link moves in a step; candidates are host-only nodes below the
    GPU frontier, best next-step value first (the k=1 term of the score). When the GPU
    is full and holds no retired cache, nothing can be loaded and the frontier is not
    scanned (the usual state under pressure; retired cache must sort first in the
    policy's key, as in ``pbkv``'s).
    ``aggressive`` may also displace active cache that the policy ranks below the
    candidate. ``next-fixed`` (KVFlow) loads the fixed prefixes of agents one step from
    running, displacing only what its own order ranks below them.

    Args:
        tree: the radix tree.
        policy: the cache policy (its prefetch mode and eviction key).
        scores: the score board (next-step values).
        kvflow: KVFlow's tracker, for ``next-fixed``.
        bytes_per_block: KV bytes of one block.
        bandwidth_bytes_per_s: host-to-GPU bandwidth.
    """

    def __init__(
        self,
        tree: RadixTree,
        policy: Policy,
        scores: ScoreBoard,
        kvflow: KVFlowTracker | None,
        *,
        bytes_per_block: int,
        bandwidth_bytes_per_s: float,
    ) -> None:
        self.tree = tree
        self.policy = policy
        self.scores = scores
        self.kvflow = kvflow
        self.bytes_per_block = bytes_per_block
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s

    def plan(self, step_s: float) -> list[LoadTransfer]:
        """Start the prefetches that fit in a decode step of ``step_s`` seconds.

        Returns:
            The loads started (each holds leases until it completes).

        Mutates: the tree (evictions the mode allows, loads).
        """
        if self.policy.prefetch == "none" or self.bytes_per_block <= 0:
            return []
        budget = int(self.bandwidth_bytes_per_s * step_s / self.bytes_per_block)
        if budget <= 0 or self._nothing_to_displace():
            return []
        loads: list[LoadTransfer] = []
        values = ((self._value(n), n) for n in self._frontier())
        heap = [(-v, n.serial, n) for v, n in values if v > 0]
        heapq.heapify(heap)
        while heap and budget > 0:
            _, _, node = heapq.heappop(heap)
            if not node.on_host or node.on_gpu or node.loading:
                continue  # dropped or loaded while room was made for an earlier candidate
            if node.num_blocks > budget:
                node = self.tree.split(node, budget)
            if not self._make_room(node):
                break
            loads.append(self.tree.begin_load([node], prefetch=True))
            budget -= node.num_blocks
            for child in node.children.values():
                if child.on_host and not child.on_gpu and not child.loading:
                    v = self._value(child)
                    if v > 0:
                        heapq.heappush(heap, (-v, child.serial, child))
        return loads

    def _nothing_to_displace(self) -> bool:
        """Conservative mode with a full GPU and no retired cache on it: no candidate can
        get room, so the frontier need not be scanned (the policy's key puts retired
        cache first, so some is displaceable exactly when the first candidate is)."""
        if self.policy.prefetch != "conservative" or self.tree.gpu.num_free > 0:
            return False
        lowest = self.tree.lowest_candidate("gpu")
        return lowest is None or not lowest.retired

    def _value(self, node: Node) -> float:
        if self.kvflow is not None:
            return 1.0 if node.fixed_agents & self.kvflow.next_step_agents() else 0.0
        return self.scores.next_step_value(node)

    def _frontier(self) -> set[Node]:
        if self.kvflow is not None:
            pool = {n for a in self.kvflow.next_step_agents() for n in self.kvflow.fixed_nodes(a)}
        else:
            pool = {n for w in self.scores.active_workflows for n in self.scores.nodes_of(w)}
        frontier: set[Node] = set()
        for node in pool:
            parent = node.parent
            parent_ready = parent is None or parent.is_root or parent.on_gpu
            if node.on_host and not node.on_gpu and not node.loading and parent_ready:
                frontier.add(node)
        return frontier

    def _make_room(self, node: Node) -> bool:
        short = node.num_blocks - self.tree.gpu.num_free
        if short > 0:
            # Lease the candidate: demoting retired cache may need host room, and must not
            # take it by dropping the very host copy about to be loaded.
            lease = self.tree.lock(node)
            if self.policy.prefetch == "conservative":
                self.tree.evict("gpu", short, retired_only=True)
            else:
                self.tree.evict("gpu", short, below=self.policy.priority(node))
            self.tree.unlock(lease)
        return self.tree.can_allocate("gpu", node.num_blocks)
