"""The KV manager's synchronous core: admission, commit, prefetch and lifecycle updates.

An owned-cache engine calls this directly from its scheduler step (no message hop on
the allocation path, §4); the KV-manager actor feeds it lifecycle events and
forecasts. Plain synchronous code: no trio, no torch.

:class:`KVManager` builds the tree, score board, trackers and prefetcher and wires the
tree's hooks; it is assembled from mixins over
:class:`~pbkv.kvmanager.manager_state.ManagerState`:
:mod:`~pbkv.kvmanager.manager_queries` (what a scheduler asks before admitting),
:mod:`~pbkv.kvmanager.manager_admission` (admit, commit, release) and
:mod:`~pbkv.kvmanager.manager_lifecycle` (workflow events). This module keeps
construction, host-copy maintenance, prefetch and statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pbkv.kvmanager.belady import BeladyTracker, FutureStep
from pbkv.kvmanager.bounds import AccessLog
from pbkv.kvmanager.continuum import ContinuumTracker
from pbkv.kvmanager.kvflow import KVFlowTracker, StepGraph
from pbkv.kvmanager.manager_admission import ManagerAdmission
from pbkv.kvmanager.manager_lifecycle import ManagerLifecycle
from pbkv.kvmanager.manager_state import Admission, AdmitRequest, ManagerCounters
from pbkv.kvmanager.node import Node
from pbkv.kvmanager.policies import Policy, get_policy
from pbkv.kvmanager.prefetch import Prefetcher
from pbkv.kvmanager.radix import LoadTransfer, RadixTree, TreeHooks
from pbkv.kvmanager.scoring import ScoreBoard
from pbkv.kvmanager.stats import KVStatistics
from pbkv.kvmanager.survival import SurvivalTracker, WarmupPrefetcher
from pbkv.kvmanager.timing import TimeWeights
from pbkv.kvmanager.waiting import WaitingPrefixes

# Admission and AdmitRequest: re-exported for their importers here
__all__ = ["Admission", "AdmitRequest", "BaselineInputs", "KVConfig", "KVManager"]


@dataclass(frozen=True, slots=True)
class KVConfig:
    """Sizes and policy of one KV manager.

    Args:
        block_size: tokens per block.
        gpu_capacity_blocks / host_capacity_blocks: tier sizes in blocks.
        bytes_per_block: KV bytes of one block (all layers), for transfer accounting.
        policy: a name from :data:`pbkv.kvmanager.policies.POLICIES`.
        horizon: forecast steps ``K`` used by the score.
        gamma: confidence decay of the score (paper Eq. 2).
        beyond_horizon: add the score's tail past step ``K`` from each workflow's recent
            call shares (:func:`~pbkv.kvmanager.scoring.agent_weights`), so a weak or
            short forecast degrades toward recency instead of zero weight.
        bandwidth_bytes_per_s: host-to-GPU bandwidth, for the prefetch budget ``S_bw``.
        host_tier: the host-tier model, ``exclusive`` (TensorRT-LLM: offload on GPU
            eviction) or ``write-through`` (SGLang HiCache's default); see
            :mod:`pbkv.kvmanager.radix`.
    """

    block_size: int
    gpu_capacity_blocks: int
    host_capacity_blocks: int
    bytes_per_block: int = 0
    policy: str = "pbkv"
    horizon: int = 3
    gamma: float = 0.8
    bandwidth_bytes_per_s: float = 0.0
    beyond_horizon: bool = True
    host_tier: str = "exclusive"


@dataclass(frozen=True, slots=True)
class BaselineInputs:
    """What the baseline policies know beyond the cache itself.

    Args:
        step_graph_edges: the app's static agent step graph (``kvflow``).
        future: workflow id → its steps (prompt block keys, start offset in the
            workflow), in submission order (``belady-est``, an estimate of next uses).
        concurrency: workflows in flight at once (``belady-est`` places pending ones in time).
    """

    step_graph_edges: tuple[tuple[str, str], ...] = ()
    future: Mapping[str, Sequence[FutureStep]] | None = None
    concurrency: int = 1


class KVManager(ManagerAdmission, ManagerLifecycle):
    """PBKV's cache manager over a :class:`RadixTree` (§5).

    Args:
        config: sizes and policy.
        clock: current time in seconds (``pbkv.runtime.clock.now_s`` under actors).
        baseline: step graph / full workload for the ``kvflow`` and ``belady-est`` policies.
        access_log: records every admitted prompt and every commit, in order, for the
            offline bounds (:mod:`pbkv.kvmanager.bounds`); ``None`` records nothing.

    Raises:
        ValueError: unknown policy name, or a baseline policy without its inputs.
    """

    def __init__(
        self,
        config: KVConfig,
        clock: Callable[[], float],
        baseline: BaselineInputs | None = None,
        access_log: AccessLog | None = None,
    ) -> None:
        self.config = config
        self.access_log = access_log
        self.policy: Policy = get_policy(config.policy)
        self.tree = RadixTree(
            block_size=config.block_size,
            gpu_capacity_blocks=config.gpu_capacity_blocks,
            host_capacity_blocks=config.host_capacity_blocks,
            priority=self.policy.priority,
            clock=clock,
            host_tier=config.host_tier,
        )
        self.scores = ScoreBoard(
            self.tree.reprioritize,
            config.gamma,
            shift_groups=self.tree.shift_scores,
            beyond_horizon=config.beyond_horizon,
        )
        self.timing: TimeWeights | None = None
        """The time-aware score's per-workflow weights (policies with ``time_aware``)."""
        if self.policy.time_aware and self.policy.uses_forecasts:
            self.timing = TimeWeights(self.scores, clock)
        self.waiting = WaitingPrefixes(self.tree, count_nodes=self.policy.queue_aware)
        self.tree.hooks.on_split = self._on_split
        self.tree.hooks.on_remove = self._on_remove
        self.tree.hooks.on_insert = self.waiting.on_insert
        self._counters = ManagerCounters()
        self._init_queries()
        # prompt block keys running requests are computing (admitted, not yet committed)
        self._computing: dict[int, int] = {}
        self.kvflow: KVFlowTracker | None = None
        self.belady: BeladyTracker | None = None
        self.continuum: ContinuumTracker | None = None
        self.survival: SurvivalTracker | None = None
        self._attach_tracker(baseline or BaselineInputs())
        self.prefetcher = Prefetcher(
            self.tree,
            self.policy,
            self.scores,
            self.kvflow,
            bytes_per_block=config.bytes_per_block,
            bandwidth_bytes_per_s=config.bandwidth_bytes_per_s,
        )
        if self.survival is not None:  # its next-agent warm-up values the candidates
            self.prefetcher = WarmupPrefetcher(
                self.survival,
                self.tree,
                self.policy,
                self.scores,
                None,
                bytes_per_block=config.bytes_per_block,
                bandwidth_bytes_per_s=config.bandwidth_bytes_per_s,
            )

    def _attach_tracker(self, inputs: BaselineInputs) -> None:
        if self.policy.tracker == "kvflow":
            if not inputs.step_graph_edges:
                raise ValueError("policy 'kvflow' needs the app's step graph (step_graph_edges)")
            graph = StepGraph(inputs.step_graph_edges)
            self.kvflow = KVFlowTracker(graph, self.tree.reprioritize)
        elif self.policy.tracker == "belady":
            if inputs.future is None:
                raise ValueError("policy 'belady-est' needs the whole workload in advance (future)")
            self.belady = BeladyTracker(
                inputs.future,
                inputs.concurrency,
                self.tree.nodes,
                self.tree.reprioritize,
                self.tree.clock,
            )
        elif self.policy.tracker == "continuum":
            bandwidth = self.config.bandwidth_bytes_per_s
            reload_s = self.config.bytes_per_block / bandwidth if bandwidth > 0 else 0.0
            self.continuum = ContinuumTracker(
                self.tree, reload_s_per_block=reload_s, shortfall=self.gpu_shortfall
            )
        elif self.policy.tracker == "survival":
            self.survival = SurvivalTracker(self.scores, self.tree.reprioritize)

    def _on_split(self, node: Node, top: Node) -> None:
        self.scores.on_split(node, top)
        self.waiting.on_split(node)
        if self.kvflow is not None:
            self.kvflow.on_split(node, top)

    def _on_remove(self, node: Node) -> None:
        self.scores.on_remove(node)
        self.waiting.on_remove(node)
        if self.kvflow is not None:
            self.kvflow.on_remove(node)

    def set_demote_hook(self, hook: Callable[[Node, list[int], list[int]], None] | None) -> None:
        """Have ``hook(node, gpu_blocks, host_blocks)`` copy each demoted GPU copy to the host.

        An owned-cache engine that keeps real KV installs it once (see
        :attr:`~pbkv.kvmanager.radix.TreeHooks.on_demote` for when it runs); ``None``
        restores the no-op default (engines without tensors, such as ``sim``).
        """
        self.tree.hooks.on_demote = hook if hook is not None else TreeHooks().on_demote

    def discard_host_blocks(self, host_blocks: set[int]) -> int:
        """Forget host copies held in ``host_blocks``: their device-to-host copy failed.

        A failed copy must never leave a node resident (§5.1). Nodes still leased keep
        their copy (none is, after an engine has failed and released its requests).

        Returns:
            Nodes whose host copy was discarded.
        """
        hit = [n for n in self.tree.nodes() if n.host_blocks and host_blocks & set(n.host_blocks)]
        discarded = 0
        for node in hit:
            attached = node.parent is not None and node.parent.children.get(node.keys[0]) is node
            if attached and node.on_host and not node.lock_count:
                self.tree.discard_copy(node, "host")
                discarded += 1
        return discarded

    def complete_load(self, load: LoadTransfer, *, ok: bool) -> None:
        """Finish a host-to-GPU copy (see :meth:`RadixTree.complete_load`)."""
        self.tree.complete_load(load, ok=ok)

    def plan_prefetch(self, step_s: float) -> list[LoadTransfer]:
        """Start the policy's prefetches for this pure-decode step (see :class:`Prefetcher`).

        Returns:
            The loads started (each holds leases until :meth:`complete_load`).

        Mutates: the tree (evictions the mode allows, loads), statistics.
        """
        if self.timing is not None:
            self.timing.refresh()
        loads = self.prefetcher.plan(step_s)
        self._counters.prefetch_issued_blocks += sum(load.num_blocks for load in loads)
        return loads

    def statistics(self) -> KVStatistics:
        """Return a snapshot of the counters. Does not modify the manager."""
        c, t = self._counters, self.tree.counters
        bpb = self.config.bytes_per_block
        return KVStatistics(
            policy=self.policy.name,
            requests=c.requests,
            prompt_tokens=c.prompt_tokens,
            cached_gpu_tokens=c.cached_gpu_tokens,
            cached_host_tokens=c.cached_host_tokens,
            computed_tokens=c.prompt_tokens - c.cached_gpu_tokens - c.cached_host_tokens,
            evicted_retired_blocks=t.evicted_retired_blocks,
            evicted_active_blocks=t.evicted_active_blocks,
            demoted_blocks=t.demoted_blocks,
            dropped_blocks=t.dropped_blocks,
            h2d_bytes=t.h2d_blocks * bpb,
            d2h_bytes=t.d2h_blocks * bpb,
            prefetch_issued_blocks=c.prefetch_issued_blocks,
            prefetch_used_blocks=c.prefetch_used_blocks,
            prefetch_wasted_blocks=t.prefetch_wasted_blocks,
            rejected_admissions=c.rejected_admissions,
            rejected_forecasts=c.rejected_forecasts,
            score_refreshed_nodes=self.scores.refreshed_nodes,
            resumed_admissions=c.resumed_admissions,
            resumed_computed_tokens=c.resumed_computed_tokens,
        )

    def check_integrity(self) -> None:
        """Assert the tree's invariants (§5.1), the score board's grouping and that the
        queue's index is current."""
        self.tree.check_integrity()
        self.scores.check_integrity()
        self.waiting.check_integrity()
        if self.continuum is not None:
            self.continuum.check_integrity()
