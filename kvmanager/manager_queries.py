"""What a scheduler asks the KV manager before admitting: refusals, queue, room (§7.0).

A scheduler retries its queued requests on every step. These queries answer without
matching, leasing or evicting: whether :meth:`~ManagerQueries.refusals` would refuse a
request as the cache is (decided from the queue's index, kept per tree version), how
many of a queued prompt's blocks are cached, whether its next block is being computed,
and how many GPU blocks it lacks or a retraction would give. The queue's notes
(:meth:`~ManagerQueries.note_queue`) keep that index, and the queue-aware policies'
``queued`` counts, current.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from pbkv.kvmanager.manager_state import Admission, AdmitRequest, ManagerState
from pbkv.kvmanager.node import Node
from pbkv.kvmanager.waiting import QueuedPrompt, QueuedWalk


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


class ManagerQueries(ManagerState):
    """The admission queries of :class:`~pbkv.kvmanager.manager.KVManager`."""

    def _init_queries(self) -> None:
        """Start the caches the queries keep per tree and queue-index version."""
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

    def blocks_needed(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """Return the GPU blocks a request holds at its peak (prompt + output)."""
        return math.ceil((prompt_tokens + max_new_tokens) / self.config.block_size)

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

    def _keep_settled(self) -> None:
        """Take the tree's latest change as settled (a commit that moved nothing an
        admission reads): :meth:`settled_version` keeps its count."""
        self._settled_at = self.tree.version

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
