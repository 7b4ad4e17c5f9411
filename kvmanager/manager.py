"""The KV manager's synchronous core: admission, commit, prefetch and lifecycle updates.

An owned-cache engine calls this directly from its scheduler step (no message hop on
the allocation path, §4); the KV-manager actor feeds it lifecycle events and
forecasts. Plain synchronous code: no trio, no torch.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pbkv.kvmanager.belady import BeladyTracker, FutureStep
from pbkv.kvmanager.bounds import AccessLog, LoggedInsert
from pbkv.kvmanager.continuum import ContinuumTracker
from pbkv.kvmanager.kvflow import KVFlowTracker, StepGraph
from pbkv.kvmanager.node import Node
from pbkv.kvmanager.policies import Policy, get_policy
from pbkv.kvmanager.prefetch import Prefetcher
from pbkv.kvmanager.radix import Lease, LoadTransfer, MatchResult, RadixTree, TreeHooks
from pbkv.kvmanager.scoring import ScoreBoard
from pbkv.kvmanager.stats import KVStatistics
from pbkv.kvmanager.survival import SurvivalTracker, WarmupPrefetcher
from pbkv.kvmanager.timing import TimeWeights
from pbkv.kvmanager.waiting import QueuedPrompt, QueuedWalk, WaitingPrefixes

log = logging.getLogger(__name__)


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


@dataclass(frozen=True, slots=True)
class AdmitRequest:
    """What admission needs to know of one request.

    Args:
        keys: block keys of the prompt's full blocks.
        prompt_tokens: prompt length in tokens.
        max_new_tokens: decode budget reserved at admission (so decode never runs out).
        workflow_id / agent: who asks (``None`` for requests outside any workflow).
        namespace: tenant / cache salt.
        fixed_prefix_tokens: leading prompt tokens that are the agent's fixed prefix
            (shared preamble + role prompt), for KVFlow.
        resumed: the re-admission of a retracted request (prompt = its prompt plus the
            tokens it had generated): counted apart from requests, and not an access in
            the offline bounds' log (it re-reads what the request itself computed).
    """

    keys: list[int]
    prompt_tokens: int
    max_new_tokens: int
    workflow_id: str | None = None
    agent: str = ""
    namespace: str = ""
    fixed_prefix_tokens: int = 0
    resumed: bool = False


@dataclass(eq=False, slots=True)
class Admission:
    """A running request's hold on the cache.

    Attributes:
        request: the admitted request.
        lease: lock on its cached prefix (moves down as the prefix grows).
        matched_blocks: blocks of the prompt found cached (GPU + host).
        cached_gpu_tokens / cached_host_tokens: prompt tokens found in each tier.
        loads: host-to-GPU copies the request must wait for (own and joined).
        private_blocks: GPU blocks reserved for the uncached prompt and the output.
        committed_blocks: prompt blocks inserted into the tree so far.
        logged: the access log's record of the latest commit (with a log).
    """

    request: AdmitRequest
    lease: Lease
    matched_blocks: int
    cached_gpu_tokens: int
    cached_host_tokens: int
    loads: list[LoadTransfer]
    private_blocks: list[int]
    committed_blocks: int = 0
    done: bool = False
    logged: LoggedInsert | None = None

    @property
    def computed_tokens(self) -> int:
        return self.request.prompt_tokens - self.cached_gpu_tokens - self.cached_host_tokens


@dataclass(frozen=True, slots=True)
class _Slow:
    """A request :meth:`KVManager.refusals` leaves to ``_refused_as_is``, with its
    peak GPU blocks."""

    request: AdmitRequest
    total: int


@dataclass(frozen=True, slots=True)
class _QuickRefusals:
    """What :meth:`KVManager.refusals` found for ``requests`` by its quick test (the
    lowest candidate active or none): the keys it refused (``refused``) and the requests
    left to the full test (``slow``), valid while the index's ``version``, the ``free``
    GPU blocks and the ``lowest`` candidate stay, for the same request objects (held
    here, so their ids are not reused)."""

    version: int
    free: int
    lowest: Node | None
    requests: list[AdmitRequest]
    refused: frozenset[int]
    slow: list[_Slow]

    def holds(
        self, version: int, free: int, lowest: Node | None, requests: list[AdmitRequest]
    ) -> bool:
        return (
            self.version == version
            and self.free == free
            and self.lowest is lowest
            and len(self.requests) == len(requests)
            and all(map(operator.is_, self.requests, requests))
        )


@dataclass(frozen=True, slots=True)
class _Need:
    """A queued request's GPU blocks at its peak (``total``), those beyond its cached
    prefix (``blocks``, before loads) and its walk (``None``: not current, or a match
    would split a node)."""

    total: int
    blocks: int
    walk: QueuedWalk | None


@dataclass(slots=True)
class _Counters:
    requests: int = 0
    prompt_tokens: int = 0
    cached_gpu_tokens: int = 0
    cached_host_tokens: int = 0
    prefetch_issued_blocks: int = 0
    prefetch_used_blocks: int = 0
    rejected_admissions: int = 0
    rejected_forecasts: int = 0
    resumed_admissions: int = 0
    resumed_computed_tokens: int = 0


class KVManager:
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
        self._counters = _Counters()
        # what _refused_as_is reads of the tree, as of tree version _room_at
        self._room_at = -1
        self._free = self._unleased = 0
        self._lowest: Node | None = None
        # what refusals() keeps per queued request while the index's version stays
        self._needs_at = -1
        self._needs: dict[int, _Need] = {}
        self._quick: _QuickRefusals | None = None  # refusals()' last quick tests
        # settled_version(): bumped when the tree changed other than by settled commits
        self._settled = 0
        self._settled_at = -1  # the tree version the count stands for
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

    # -- admission (engine scheduler step) -----------------------------------------

    def blocks_needed(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """Return the GPU blocks a request holds at its peak (prompt + output)."""
        return math.ceil((prompt_tokens + max_new_tokens) / self.config.block_size)

    def try_admit(self, request: AdmitRequest, *, retired_only: bool = False) -> Admission | None:
        """Match, lease and reserve GPU space for ``request``, evicting as the policy says.

        Host-only matched blocks are loaded (the returned admission lists the loads to
        wait for); in-flight loads of the same blocks are joined, not repeated.

        Args:
            request: what to admit.
            retired_only: make room from free and retired blocks only, never by evicting
                active cache (a scheduler admitting work that is worth less than what is
                cached, §7.0).

        Returns:
            The admission, or ``None`` when the GPU cannot hold the request now (it
            stays queued; nothing changed but the eviction already done). A queued
            request (:meth:`note_queue`) that would be refused with nothing changed is
            refused without matching, leasing or evicting (see :meth:`_refused_as_is`).

        Raises:
            ValueError: the request can never fit in the GPU tier.

        Mutates: the tree (match splits, leases, evictions, loads), statistics.
        """
        bs = self.config.block_size
        total = -(-(request.prompt_tokens + request.max_new_tokens) // bs)  # blocks_needed
        if len(request.keys) > request.prompt_tokens // bs:
            raise ValueError(
                f"{len(request.keys)} block keys for a {request.prompt_tokens}-token prompt "
                f"(block size {self.config.block_size})"
            )
        if total > self.config.gpu_capacity_blocks:
            raise ValueError(
                f"request needs {total} GPU blocks; the tier holds "
                f"{self.config.gpu_capacity_blocks}"
            )
        if self.continuum is not None:
            self.continuum.before_admit(request)
        if self.timing is not None:
            self.timing.refresh()
        if self._refused_as_is(request, total, retired_only):
            self._counters.rejected_admissions += 1
            return None
        match = self.tree.match_prefix(request.keys, request.namespace)
        lease = self.tree.lock(match.node)
        try:
            admitted = self._reserve(match, total, retired_only)
        except BaseException:
            self.tree.unlock(lease)
            raise
        if admitted is None:
            self.tree.unlock(lease)
            self._counters.rejected_admissions += 1
            return None
        loads, private = admitted
        matched = match.gpu_blocks + match.host_blocks
        computing = self._computing
        for key in request.keys[matched:]:
            computing[key] = computing.get(key, 0) + 1
        self._count_admission(request, match.path, match.gpu_blocks, match.host_blocks)
        if self.access_log is not None and not request.resumed:
            self.access_log.access(request.keys, request.namespace, request.prompt_tokens)
        self._touch(match.path, request)
        if self.continuum is not None:
            self.continuum.on_admitted(request)
        if self.timing is not None and request.workflow_id is not None:
            self.timing.on_admitted(request.workflow_id)
        return Admission(
            request=request,
            lease=lease,
            matched_blocks=matched,
            cached_gpu_tokens=match.gpu_blocks * bs,
            cached_host_tokens=match.host_blocks * bs,
            loads=loads,
            private_blocks=private,
            committed_blocks=matched,
        )

    def count_refusals(self, requests: int) -> None:
        """Count ``requests`` admissions as refused without trying them: a scheduler
        that tried them at this :attr:`RadixTree.version` and was refused each time with
        nothing changed knows :meth:`try_admit` would refuse them again.

        Mutates: statistics only (``rejected_admissions``).
        """
        self._counters.rejected_admissions += requests

    def settled_version(self) -> int:
        """Return a version of everything :meth:`try_admit` (refusing as is),
        :meth:`refusals` and :meth:`prefix_in_flight` read: equal answers mean these
        calls answer as they did, for the same requests.

        :attr:`RadixTree.version` moves with every change; this one ignores *settled*
        commits, those that only hang the request's new blocks as one new leaf below
        its own lease: the free blocks, the unleased blocks, every candidate and its
        key and every queued walk stay (a walk the new leaf extends moves the queue's
        index, and the commit is then not settled); what changes is leased (the new
        leaf, the prefix's timestamps and scores) or is the request's own in-flight
        keys, which only a walk the leaf extends could meet. Chunk commits of
        balanced batches (§7.0) are such, one on each step. Never settled under a
        ``kvflow`` or ``belady-est`` policy (their trackers read more).

        Mutates: nothing observable (it keeps its count per tree version).
        """
        if self.tree.version != self._settled_at:
            self._settled_at = self.tree.version
            self._settled += 1
        return self._settled

    def refusals(self, requests: Iterable[AdmitRequest], *, retired_only: bool = False) -> set[int]:
        """Return ``id(request.keys)`` of each of ``requests`` that :meth:`try_admit`
        would refuse now without trying, the cache as it is (see :meth:`_refused_as_is`).

        One pass for a scheduler that tries many queued requests in a row (those it
        holds back, retried on every step); valid while :attr:`RadixTree.version` stays.
        A request :meth:`try_admit` would reject with ``ValueError`` is never named.
        Counts nothing: the caller counts what it refuses (:meth:`count_refusals`).

        Does not modify the cache.
        """
        bs, capacity = self.config.block_size, self.config.gpu_capacity_blocks
        self._read_room()
        lowest, free, index = self._lowest, self._free, self.waiting
        # Retired-only, with the lowest candidate active (or none): a request whose
        # current, whole walk avoids that candidate is refused iff it lacks free blocks
        # (see _refused_as_is); its shortfall is kept while the index's walks stay.
        quick = retired_only and self.belady is None and (lowest is None or not lowest.retired)
        if self._needs_at != index.version:
            self._needs_at, self._needs = index.version, {}
        needs = self._needs
        requests = list(requests)
        last = self._quick
        if quick and last is not None and last.holds(index.version, free, lowest, requests):
            refused, slow = set(last.refused), last.slow  # the quick tests, as they came out
        else:
            refused, slow = set(), []
            for request in requests:
                key = id(request.keys)
                total = -(-(request.prompt_tokens + request.max_new_tokens) // bs)
                if len(request.keys) > request.prompt_tokens // bs or total > capacity:
                    continue  # try_admit raises
                if quick:
                    need = needs.get(key)
                    if need is None or need.total != total:
                        need = needs[key] = self._need(request, total)
                    walk = need.walk
                    if walk is not None and need.blocks > free and lowest not in walk.path:
                        refused.add(key)  # (lowest is None or active: see quick)
                        continue
                slow.append(_Slow(request, total))
            if quick:
                self._quick = _QuickRefusals(
                    index.version, free, lowest, requests, frozenset(refused), slow
                )
        for left in slow:  # these read more of the tree: tested every time
            if self._refused_as_is(left.request, left.total, retired_only):
                refused.add(id(left.request.keys))
        return refused

    def _need(self, request: AdmitRequest, total: int) -> _Need:
        walk = self.waiting.current_walk(request.keys, request.namespace)
        if walk is None or not walk.whole:
            return _Need(total, 0, None)
        return _Need(total, total - walk.matched_blocks, walk)

    def _read_room(self) -> None:
        """Read free and unleased GPU blocks and the lowest GPU candidate, once per tree
        version."""
        tree = self.tree
        if self._room_at != tree.version:
            self._room_at = tree.version
            self._free = tree.gpu.num_free
            self._unleased = tree.cached_blocks("gpu") - tree.leased_blocks("gpu")
            self._lowest = tree.lowest_candidate("gpu")

    def _refused_as_is(self, request: AdmitRequest, total: int, retired_only: bool) -> bool:
        """Return whether :meth:`try_admit` would refuse ``request`` and leave the cache
        as it is: decided from the queue's index (:meth:`note_queue`), without matching,
        leasing or evicting, so a queued request retried on every scheduler step costs
        its walk's length, not a match, lock, eviction scan and unlock.

        ``True`` only when the index holds the request's walk current, the match would
        split no node, and the request fails one of :meth:`_reserve`'s tests before any
        eviction: an in-flight load below one it would start, too few unleased GPU
        blocks outside its prefix, or (``retired_only``) a lowest eviction candidate
        outside its prefix that is not retired, so the eviction would stop at once.
        ``False`` means "try it": the full path decides, with its side effects.

        Does not modify the cache (it keeps what it read of the tree per tree version).
        """
        walk = self.waiting.current_walk(request.keys, request.namespace)
        if walk is None or not walk.whole:
            return False  # unknown, or match_prefix would split the last node
        self._read_room()
        path, lowest = walk.path, self._lowest
        # A retired-only eviction frees nothing when the lowest candidate is active and
        # off the request's prefix (on it, the lease would skip it), or there is none.
        stops = retired_only and (lowest is None or (not lowest.retired and lowest not in path))
        # at least what it lacks (host-only blocks to load come on top)
        short = total - walk.matched_blocks - self._free
        if short > 0:
            if short > self._unleased:
                return True  # _make_gpu_room refuses before evicting
            if stops and self.belady is None:
                return True  # the eviction stops at once, short of room
        own = to_load = 0  # the prefix's unleased GPU blocks; host-only blocks to load
        for node in path:  # GPU nodes first (residency is prefix-closed), then host-only
            if node.gpu_blocks is not None:
                if node.lock_count == 0:
                    own += len(node.gpu_blocks)
            elif not node.loading:
                to_load += node.num_blocks
            elif to_load:
                return True  # an in-flight load below one it would start: it must wait
        short += to_load
        if short <= 0:
            return False  # it fits
        if self._unleased - own < short:
            return True  # _make_gpu_room refuses before evicting
        return stops and self.belady is None  # else the eviction frees enough

    def _reserve(
        self, match: MatchResult, total: int, retired_only: bool = False
    ) -> tuple[list[LoadTransfer], list[int]] | None:
        """Make GPU room, start (or join) the loads of host-only matched nodes and take
        the private blocks; ``None`` when the request must wait."""
        host_nodes = match.host_nodes
        to_load = [n for n in host_nodes if not n.loading]
        if to_load and any(n.loading for n in host_nodes[host_nodes.index(to_load[0]) :]):
            return None  # an in-flight load below a failed one: wait for it to finish
        matched = match.gpu_blocks + match.host_blocks
        need = sum(n.num_blocks for n in to_load) + total - matched
        if not self._make_gpu_room(need, retired_only):
            return None
        loads = self._joined_loads(host_nodes)
        if to_load:
            loads.append(self.tree.begin_load(to_load))
        return loads, self.tree.allocate_private("gpu", total - matched)

    def _make_gpu_room(self, need_blocks: int, retired_only: bool = False) -> bool:
        short = need_blocks - self.tree.gpu.num_free
        if short > 0:
            # Evict only if it can succeed: a request that will be rejected anyway must not
            # flush the cache on every scheduler step while it waits.
            unleased = self.tree.cached_blocks("gpu") - self.tree.leased_blocks("gpu")
            if unleased < short:
                return False
            if self.belady is not None:
                self.belady.refresh()
            self.tree.evict("gpu", short, retired_only=retired_only)
        return self.tree.can_allocate("gpu", need_blocks)

    def _joined_loads(self, nodes: Sequence[Node]) -> list[LoadTransfer]:
        loads: list[LoadTransfer] = []
        for node in nodes:
            load = self.tree.load_of(node)
            if load is not None and load not in loads:
                loads.append(load)
        return loads

    def _count_admission(
        self, request: AdmitRequest, path: Sequence[Node], gpu_blocks: int, host_blocks: int
    ) -> None:
        c = self._counters
        bs = self.config.block_size
        if request.resumed:
            c.resumed_admissions += 1
            c.resumed_computed_tokens += request.prompt_tokens - (gpu_blocks + host_blocks) * bs
        else:
            c.requests += 1
            c.prompt_tokens += request.prompt_tokens
            c.cached_gpu_tokens += gpu_blocks * bs
            c.cached_host_tokens += host_blocks * bs
        for node in path:
            if node.prefetched:
                c.prefetch_used_blocks += node.num_blocks
                node.prefetched = False
            elif node.loading and (load := self.tree.load_of(node)) is not None and load.prefetch:
                c.prefetch_used_blocks += node.num_blocks
                load.prefetch = False  # counted once: it lands as ordinary, used cache

    def _touch(self, path: Sequence[Node], request: AdmitRequest) -> None:
        now = self.tree.clock()
        for node in path:
            node.last_access_s = now
            self.tree.reprioritize(node)
        if request.workflow_id is not None:
            if self.policy.uses_forecasts:
                self.scores.leave_branch(request.workflow_id, request.agent, path)
            self.scores.touch(path, request.workflow_id, request.agent)
        if self.kvflow is not None and request.fixed_prefix_tokens:
            self.kvflow.mark_fixed(self._fixed_part(path, request), request.agent)

    def _touch_leased(self, path: Sequence[Node], request: AdmitRequest) -> None:
        """Do :meth:`_touch` for a ``path`` the request leases whose nodes the insert
        just stamped with the time: re-keying a leased node is a no-op
        (:meth:`RadixTree.reprioritize`), so only the scores and fixed marks are left."""
        self.tree.version += 1
        if request.workflow_id is not None:
            self.scores.touch(path, request.workflow_id, request.agent)
        if self.kvflow is not None and request.fixed_prefix_tokens:
            self.kvflow.mark_fixed(self._fixed_part(path, request), request.agent)

    def _fixed_part(self, path: Sequence[Node], request: AdmitRequest) -> list[Node]:
        """Return the nodes of ``path`` inside the request's fixed prefix, splitting the
        node that straddles its end so suffixes stay dynamic."""
        fixed_blocks = request.fixed_prefix_tokens // self.config.block_size
        start = 0
        fixed = []
        for node in path:
            if start >= fixed_blocks:
                break
            if start + node.num_blocks > fixed_blocks:
                node = self.tree.split(node, fixed_blocks - start)
            fixed.append(node)
            start += node.num_blocks
        return fixed

    def note_waiting(self, waiting: Iterable[AdmitRequest]) -> int:
        """Protect the cached prefixes of queued requests (queue-aware eviction, §7.0).

        Each node on a queued request's cached prefix gets ``queued`` = the number of
        such requests; a queue-aware policy adds it to the node's score (a queued
        request is a certain next use). Every policy indexes the queue's prefixes for
        :meth:`queued_cached_blocks`; only a queue-aware one counts them into nodes.
        ``waiting`` is the whole queue; see :meth:`note_queue`.

        Returns:
            Nodes whose count changed (0 for a policy that is not queue-aware).

        Mutates: ``queued`` counts and eviction order of those nodes.
        """
        return self.note_queue((r.keys, r.namespace) for r in waiting)

    def note_queue(self, queue: Iterable[QueuedPrompt], held: Collection[int] = ()) -> int:
        """Do :meth:`note_waiting` for the whole queue given as ``(keys, namespace)`` pairs.

        A request is known by its ``keys`` list (the same object on every call, not
        changed while queued). Prefixes are walked again only where the tree changed
        since the last call (:class:`~pbkv.kvmanager.waiting.WaitingPrefixes`), and only
        nodes whose count changed are re-keyed. Requests in ``held`` (``id`` of their key
        lists: the ones a scheduler holds back behind its cohort) are indexed but not
        counted into nodes.

        Returns / Mutates: as :meth:`note_waiting`.
        """
        self.waiting.sync(queue, held)
        if not self.policy.queue_aware:
            return 0
        changed = 0
        for node, after in self.waiting.take_changes():
            if after == 0 or node.queued != after:  # a count gone to 0 is always reset
                node.queued = after
                self.tree.reprioritize(node)
                changed += 1
        return changed

    def queued_cached_blocks(self, keys: list[int], namespace: str = "") -> int:
        """Return a queued request's prompt blocks cached in either tier (GPU + host-only).

        The sum of :meth:`RadixTree.peek_prefix`; from the index the last
        :meth:`note_waiting` built when it holds ``keys`` (the same list object) and the
        tree has not changed along its path since, else by walking the tree.

        Does not modify anything.
        """
        found = self.waiting.cached_blocks(keys, namespace)
        return sum(self.tree.peek_prefix(keys, namespace)) if found is None else found

    # -- commit and release ----------------------------------------------------------

    def commit(self, admission: Admission, keys: list[int]) -> None:
        """Insert computed blocks so other requests can hit them.

        Call after prefill with the prompt's keys, and again at the end with the keys
        of prompt + output. The admission's loads must have completed.

        Args:
            admission: the request's admission.
            keys: block keys of the sequence computed so far (extends earlier calls).

        Raises:
            ValueError: the admission is finished, or ``keys`` is shorter than what was
                committed before, or more blocks are needed than were reserved.

        Mutates: the tree; the admission's lease moves to the new deepest node.
        """
        if admission.done:
            raise ValueError("admission already released")
        new = len(keys) - admission.committed_blocks
        if new < 0 or new > len(admission.private_blocks):
            raise ValueError(
                f"cannot commit {len(keys)} blocks after {admission.committed_blocks} "
                f"with {len(admission.private_blocks)} reserved"
            )
        tree = self.tree
        settled = (
            tree.version == self._settled_at
            and self.kvflow is None
            and self.belady is None
            and self.continuum is None
        )
        free, walks = tree.gpu.num_free, self.waiting.version
        old = admission.lease
        match = tree.insert_below(old.node, keys, admission.private_blocks[:new])
        self._computed(admission.request.keys, admission.committed_blocks, len(keys))
        admission.private_blocks = admission.private_blocks[new:]  # only once the tree owns them
        admission.lease = tree.lock(match.node)
        tree.unlock(old)
        admission.committed_blocks = len(keys)
        self._touch_leased(match.path, admission.request)
        if (
            settled
            and _leased_leaf(match.node, old.node, new)
            and tree.gpu.num_free == free
            and self.waiting.version == walks
        ):
            self._settled_at = tree.version  # nothing an admission reads has moved
        if self.access_log is not None:
            request = admission.request
            admission.logged = self.access_log.insert_extending(
                admission.logged, keys, request.namespace, len(request.keys)
            )

    def release(self, admission: Admission) -> None:
        """End a request: free its unused reserved blocks and its lease.

        Works for finished and failed requests alike (an engine failure releases its
        leases, §10). Releasing twice is a no-op.
        """
        if admission.done:
            return
        keys = admission.request.keys
        self._computed(keys, admission.committed_blocks, len(keys))
        admission.done = True
        self.tree.free_private("gpu", admission.private_blocks)
        admission.private_blocks = []
        if self.continuum is not None:
            self.continuum.on_released(admission)  # pins before the lease goes
        if self.survival is not None:
            self.survival.on_released(admission)
        if self.timing is not None and admission.request.workflow_id is not None:
            self.timing.on_released(admission.request.workflow_id, admission.request.agent)
        self.tree.unlock(admission.lease)

    def _computed(self, keys: Sequence[int], start: int, end: int) -> None:
        """Stop counting ``keys[start:end]`` as being computed (committed or released)."""
        computing = self._computing
        for key in keys[start:end]:
            left = computing[key] - 1
            if left:
                computing[key] = left
            else:
                del computing[key]

    def prefix_in_flight(self, keys: list[int], namespace: str = "") -> bool:
        """Return whether the first block of ``keys`` past its cached prefix is being
        computed by a running request (admitted, not yet committed).

        A request admitted now would compute that block again; waiting for the commit
        turns it into a hit (SGLang's in-batch prefix caching, across steps). Block keys
        chain the namespace and every earlier block, so equal keys mean equal prefixes.
        Does not modify anything.
        """
        computing = self._computing
        if not computing:
            return False
        cached = self.waiting.cached_blocks(keys, namespace)  # queued_cached_blocks, inlined
        if cached is None:
            cached = sum(self.tree.peek_prefix(keys, namespace))
        return cached < len(keys) and keys[cached] in computing

    def gpu_shortfall(self, request: AdmitRequest) -> int:
        """Return GPU blocks ``request`` lacks now: what it needs beyond its GPU-cached
        prefix, less the free blocks and the unleased cache outside that prefix.

        An upper bound on what :meth:`try_admit` would have to find (host-only matched
        blocks are counted as needing room even while a load of them is in flight); 0
        when the request fits. Does not modify the manager.
        """
        path, spans = self.tree.peek_spans(request.keys, request.namespace)
        on_gpu = [(n, m) for n, m in zip(path, spans, strict=True) if n.on_gpu]
        gpu_matched = sum(m for _, m in on_gpu)  # peek_prefix's GPU count, from one walk
        # the matched span only: eviction splits a node and takes its tail
        own = sum(m for n, m in on_gpu if n.lock_count == 0)
        evictable = self.tree.cached_blocks("gpu") - self.tree.leased_blocks("gpu") - own
        need = self.blocks_needed(request.prompt_tokens, request.max_new_tokens) - gpu_matched
        return max(0, need - self.tree.gpu.num_free - evictable)

    def release_gain(self, admissions: Sequence[Admission], request: AdmitRequest) -> int:
        """Return GPU blocks that become free or evictable for ``request`` once
        ``admissions`` commit what they computed and are released (retraction, §7.0).

        Their reserved blocks count (committed or freed, either way unleased), and so do
        the GPU blocks that only they lease, outside ``request``'s cached prefix (of a
        node that prefix ends inside, the tail: eviction splits it and takes that).
        A lower bound for :meth:`gpu_shortfall` to compare against. Does not modify the
        manager.
        """
        path, spans = self.tree.peek_spans(request.keys, request.namespace)
        own = {n.serial: m for n, m in zip(path, spans, strict=True)}  # blocks of each it matches
        through: dict[int, tuple[Node, int]] = {}
        gain = 0
        for admission in admissions:
            gain += len(admission.private_blocks)
            walk: Node | None = admission.lease.node
            while walk is not None and not walk.is_root:
                _, n = through.get(walk.serial, (walk, 0))
                through[walk.serial] = (walk, n + 1)
                walk = walk.parent
        for serial, (node, n) in through.items():
            if node.lock_count == n and node.gpu_blocks is not None:
                gain += len(node.gpu_blocks) - own.get(serial, 0)
        return gain

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

    # -- prefetch (§5.4) ------------------------------------------------------------

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

    # -- lifecycle (from the KV-manager actor) ---------------------------------------

    def on_workflow_started(self, workflow_id: str) -> None:
        """Register an active workflow."""
        self.scores.start(workflow_id)

    def on_forecast(self, workflow_id: str, forecast: np.ndarray, agents: Sequence[str]) -> int:
        """Refresh the scores of ``workflow_id``'s nodes from a ``(K, |V|+1)`` forecast.

        A malformed forecast (wrong shape, not finite, negative, rows not summing to 1;
        see :func:`~pbkv.kvmanager.scoring.validate_forecast`) is rejected here, at the
        boundary: it is counted (``rejected_forecasts``), logged, and the workflow keeps
        its last scores, so nothing malformed ever reaches an eviction key.

        Returns:
            Nodes refreshed: 0 for a rejected forecast, or when the policy does not use
            forecasts.
        """
        if not self.policy.uses_forecasts:
            return 0
        try:
            if len(forecast) > self.config.horizon:
                forecast = forecast[: self.config.horizon]
            return self.scores.set_forecast(workflow_id, forecast, agents)
        except (ValueError, TypeError, IndexError) as exc:
            self._counters.rejected_forecasts += 1
            log.warning("rejected forecast for workflow %s: %s", workflow_id, exc)
            return 0

    def on_agent_invoked(self, workflow_id: str, agent: str, step: int) -> None:
        """Note that ``workflow_id`` runs ``agent`` as its ``step``-th invocation (baselines)."""
        self.scores.note_invocation(workflow_id, agent)
        if self.timing is not None:
            self.timing.on_invoked(workflow_id)
        if self.kvflow is not None:
            self.kvflow.on_agent_invoked(workflow_id, agent)
        if self.belady is not None:
            self.belady.on_agent_invoked(workflow_id, step)
        if self.continuum is not None:
            self.continuum.on_agent_invoked(workflow_id)
        if self.survival is not None:
            self.survival.on_agent_invoked(workflow_id, agent)

    def on_workflow_terminated(self, workflow_id: str) -> None:
        """Retire the workflow: its private nodes become retired cache."""
        if self.survival is not None:
            self.survival.on_terminated(workflow_id)  # reads its nodes: before terminate
        self.scores.terminate(workflow_id)
        if self.timing is not None:
            self.timing.on_terminated(workflow_id)
        if self.kvflow is not None:
            self.kvflow.on_terminated(workflow_id)
        if self.belady is not None:
            self.belady.on_terminated(workflow_id)
        if self.continuum is not None:
            self.continuum.on_terminated(workflow_id)

    # -- observation -----------------------------------------------------------------

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


def _leased_leaf(node: Node, lease_node: Node, blocks: int) -> bool:
    """Return whether a commit's deepest ``node`` is a new GPU-only leaf of ``blocks``
    keys hung right below ``lease_node`` (not a split or adopted node: those have a
    host copy or leave the free blocks changed)."""
    return (
        node.parent is lease_node
        and not node.children
        and node.host_blocks is None
        and len(node.keys) == blocks
    )
