"""A request's hold on the cache: admit, commit, release (§5, §7.0).

``try_admit`` matches the prompt, leases its cached prefix, makes GPU room as the
policy says, starts (or joins) the loads of host-only blocks and reserves private
blocks for the rest and the output; ``commit`` hands computed blocks to the tree (the
lease moves down); ``release`` frees what is left. A request that does not fit now
gets ``None``, not an exception.
"""

from __future__ import annotations

from collections.abc import Sequence

from pbkv.kvmanager.manager_queries import ManagerQueries
from pbkv.kvmanager.manager_state import Admission, AdmitRequest
from pbkv.kvmanager.node import Node
from pbkv.kvmanager.radix import LoadTransfer, MatchResult


class ManagerAdmission(ManagerQueries):
    """The admission path of :class:`~pbkv.kvmanager.manager.KVManager`."""

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
            self._keep_settled()  # nothing an admission reads has moved
        if self.access_log is not None:
            request = admission.request
            admission.logged = self.access_log.insert_extending(
                admission.logged, keys, request.namespace, len(request.keys)
            )

    def release(self, admission: Admission, *, requeued: bool = False) -> None:
        """End a request: free its unused reserved blocks and its lease.

        Works for finished and failed requests alike (an engine failure releases its
        leases, §10). Releasing twice is a no-op. ``requeued``: the request was
        retracted and waits in the queue to resume, so its workflow is not away (the
        time-aware score keeps its weight).
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
            if requeued:
                self.timing.on_requeued(admission.request.workflow_id)
            else:
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
