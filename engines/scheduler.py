"""Admission schedulers for the owned-cache engines: which queued request goes next (§7.0).

Under load the queue decides as much as eviction does, so admission is part of the
policy. The schedulers, by name:

- ``fcfs``: arrival order, head-of-line blocking (SGLang's and vLLM's default).
- ``lpm``: longest cached prefix first (SGLang's ``lpm``), arrival order on ties.
- ``workflow``: pbkv's: the oldest workflow first (a workflow's age is its start
  ordinal in the KV manager, the order queue-aware eviction keeps), a request whose
  prompt is mostly cached or loading ahead of those that would recompute most of
  theirs, and requests of workflows outside the *cohort* (the oldest workflows whose
  contexts fit in the cache together) held back while the GPU has other work: when
  every running workflow's context cannot stay cached, running them all makes reuse
  cyclic (each context is evicted just before its next step), so the cohort keeps its
  contexts and the rest wait their turn. A held-back request is no near use of its
  prefix, so queue-aware eviction does not count it (its walk still ranks it): an older
  workflow's context between two tool calls comes back and goes first, so a younger
  workflow's waiting prompt must not outrank it (figures: ``docs/design.md``).
- ``continuum`` and ``autellix``: the 2025–26 baselines, Continuum's program-level FCFS
  with pinned programs first (:mod:`pbkv.engines.continuum`) and Autellix's program-level
  least attained service (:mod:`pbkv.engines.autellix`).

``lpm`` and ``workflow`` try requests past one that does not fit (bypass), but a request
overtaken ``max_bypass`` times goes first, and while it does not fit nothing behind it
is admitted, so no request starves.

Batch composition is the scheduler's call too. ``fcfs`` and ``lpm`` leave the engine
its fixed chunk (``max_prefill_tokens`` a step, 8,192 in the sim as SGLang's chunked
prefill on large GPUs): a step that carries a full chunk is compute-bound for seconds,
and every decoding request gains one token in it. ``workflow`` asks for *balanced*
(stall-free) batches instead: while requests decode, a step carries only the prefill
tokens that fit in the decode step's idle compute (Sarathi-Serve's token budget,
Agrawal et al., OSDI 2024). The prefill rate is the same (the GPU stays compute-bound),
but decodes no longer stall, so requests give their blocks back sooner and more of them
fit (figures: ``docs/design.md``). ``fcfs-balanced`` is ``fcfs`` with balanced batches,
so batch composition's share of a gain is measured apart.

Small chunks stretch a prefill over many steps, so the sim engine commits each chunk's
full blocks as it lands, and ``workflow`` holds a request whose next uncached block a
running request is computing (:meth:`KVManager.prefix_in_flight`) until it is committed:
otherwise two workflows' requests for one role prompt would both compute it (SGLang's
in-batch prefix caching does the same within a batch).

``workflow`` can also *retract* (``preempt=True``, registered as ``workflow-retract``;
SGLang's word, vLLM's preemption by recompute): when the request that must go next (a
starving one, or the best ranked) does not fit, running requests of younger workflows
are paused to make room, youngest first. The engine commits what each computed (so its
KV stays cached, and under pressure is demoted to the host tier by ordinary eviction
rather than dropped), releases its lease and reservation, and queues it again to resume
from its prompt plus the tokens it had generated. A request is retracted at most
``max_retractions`` times, and only when the retraction certainly makes the waiting
request fit.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, TypeVar

from pbkv.engines.admission import Running, Waiting, admission_of, admit_fcfs
from pbkv.engines.base import EngineError, GenerateRequest
from pbkv.kvmanager import Admission, AdmitRequest, KVManager
from pbkv.kvmanager.node import NO_WORKFLOW

E = TypeVar("E", bound=Waiting)
R = TypeVar("R", bound=Running)

DEFAULT_MAX_BYPASS = 32
"""Times a queued request may be overtaken before it blocks everything behind it."""

DEFAULT_COHORT_FILL = 0.5
"""Share of GPU + host capacity the workflow scheduler's cohort may fill (> 0): too
small a cohort idles the GPU, too large makes reuse cyclic. Chosen on hover at c=72 and
swebench at c=24 (the sweep: ``docs/design.md``)."""

DEFAULT_MAX_RETRACTIONS = 2
"""Times one request may be retracted (paused and requeued) before it runs to its end."""


class _Built(NamedTuple):
    """The KV manager's view of a queued entry, and what it was built from."""

    entry: Waiting
    asked: GenerateRequest
    request: AdmitRequest


@dataclass(eq=False, slots=True)
class _Quiet:
    """What one admission call saw, kept when it admitted, rejected and changed nothing.

    Its outcome is a function of what the KV manager's refusals read (its
    :meth:`~pbkv.kvmanager.KVManager.settled_version` and the queue index's version say
    whether that changed: a chunk commit below a running request's lease does not), the
    order entries are tried in, which of them are held back, the free batch slots and
    whether anything runs; with all of these the same, a call would try the same
    ``tried`` entries and be refused each time again. ``tree_version`` is the tree's
    version when the call began: the call changed nothing if it is still that.
    """

    kv: KVManager
    settled: int
    walks: int
    tree_version: int
    order: list[Waiting]
    held: set[int]
    running: bool
    free_slots: int
    tried: int = 0

    def same_as(self, other: _Quiet | None) -> bool:
        return (
            other is not None
            and other.kv is self.kv
            and other.settled == self.settled
            and other.walks == self.walks
            and other.running == self.running
            and other.free_slots == self.free_slots
            and (other.held is self.held or other.held == self.held)
            and _same(other.order, self.order)
        )


@dataclass(slots=True)
class _Spare:
    """Held entries' keys (``id``) that a retired-only admission would refuse as things
    stand at tree ``version`` (:meth:`KVManager.refusals`)."""

    version: int = -1
    refused: set[int] = field(default_factory=set)


class Scheduler(Protocol):
    """Admits queued requests through the KV manager while batch slots remain."""

    name: str
    balanced_prefill: bool
    """Whether the engine should cap each step's prefill at what the decode batch's
    compute slack carries (stall-free batching) instead of its fixed chunk size, and
    commit each chunk as it lands. The sim engine sizes that slack with its cost model,
    the torch engine with its measured step costs (a decode forward's time over a
    prefill token's marginal time)."""

    def admit(
        self,
        kv: KVManager,
        waiting: deque[E],
        free_slots: int,
        *,
        on_admit: Callable[[E, Admission], None],
        on_reject: Callable[[E, EngineError], None],
        running: int = 0,
        prefill_share: float | None = None,
        retractable: Sequence[R] = (),
        on_retract: Callable[[R], None] | None = None,
    ) -> None:
        """Admit what fits, in the scheduler's order; ``running`` requests hold the GPU,
        which spent ``prefill_share`` of its recent time on prefill (``None``: unknown).

        A scheduler that retracts may pause some of ``retractable`` (running requests
        the engine can pause now) through ``on_retract``, which must commit, release
        and requeue the request (appending it to ``waiting``) before it returns.

        Mutates: ``waiting`` (admitted and rejected entries leave it, retracted ones
        join it) and the KV manager.
        """
        ...


def note_waiting(
    kv: KVManager,
    waiting: Sequence[Waiting],
    *,
    ranked: bool = False,
    held: Collection[int] = (),
) -> None:
    """Tell a queue-aware policy which prefixes the queue will need (§7.0); with
    ``ranked``, index them for any policy (``KVManager.queued_cached_blocks``). Entries
    in ``held`` (their ``id``: held back behind the cohort) are indexed, not counted."""
    if ranked or kv.policy.queue_aware:
        keys = [id(e.keys) for e in waiting if id(e) in held] if held else ()
        kv.note_queue(((e.keys, e.request.namespace) for e in waiting), keys)


class _QueueNotes:
    """:func:`note_waiting`, skipped while the queue and the KV manager's index of it
    are as the last call left them (the same entries with the same key lists, the
    index's version unchanged and every walk current): syncing it again would walk and
    re-key nothing."""

    def __init__(self) -> None:
        self._kv: KVManager | None = None
        self._version = -1
        self._queue: list[Waiting] = []
        self._keys: list[list[int]] = []
        self._held: Collection[int] = ()

    def note(
        self,
        kv: KVManager,
        waiting: Sequence[Waiting],
        *,
        ranked: bool = False,
        snapshot: bool = False,
        held: Collection[int] = (),
    ) -> None:
        """Do :func:`note_waiting` unless nothing changed since the last call (``held``
        included).

        ``snapshot``: ``waiting`` is a scheduler's own list of the queue, never modified,
        and passed again only while the queue holds those entries unchanged (see
        :meth:`_RankedScheduler.admit`); it is kept as is, and when the same list comes
        back its entries' keys are not compared again.
        """
        if not (ranked or kv.policy.queue_aware):
            return
        index = kv.waiting
        if (
            kv is self._kv
            and index.version == self._version
            and index.current
            and (held is self._held or held == self._held)
            and (
                (snapshot and waiting is self._queue)
                or (
                    _same(waiting, self._queue)
                    and all(map(operator.is_, map(_KEYS, waiting), self._keys))
                )
            )
        ):
            return
        queue = waiting if snapshot and isinstance(waiting, list) else list(waiting)
        note_waiting(kv, queue, ranked=ranked, held=held)
        self._kv, self._version, self._held = kv, index.version, held
        self._queue, self._keys = queue, [e.keys for e in queue]


_KEYS = operator.attrgetter("keys")


class FCFSScheduler:
    """Arrival order; stop at the first request that does not fit (see :func:`admit_fcfs`)."""

    name = "fcfs"

    def __init__(self, *, balanced_prefill: bool = False) -> None:
        self.balanced_prefill = balanced_prefill
        self._notes = _QueueNotes()

    def admit(
        self,
        kv: KVManager,
        waiting: deque[E],
        free_slots: int,
        *,
        on_admit: Callable[[E, Admission], None],
        on_reject: Callable[[E, EngineError], None],
        running: int = 0,
        prefill_share: float | None = None,
        retractable: Sequence[R] = (),
        on_retract: Callable[[R], None] | None = None,
    ) -> None:
        """Admit in arrival order; never retracts (what SGLang's and vLLM's users get)."""
        self._notes.note(kv, waiting)
        admit_fcfs(kv, waiting, free_slots, on_admit=on_admit, on_reject=on_reject)


class _RankedScheduler:
    """Admit in :meth:`rank` order with bounded bypass.

    Entries :meth:`deferred` names are admitted only when nothing runs and nothing else
    was admitted in the same call (work-conserving), and are not charged bypasses while
    deferred.

    Args:
        max_bypass: times a request may be overtaken by a later arrival before it goes
            first and blocks the queue behind it until it fits, >= 0.

    Raises:
        ValueError: negative ``max_bypass``.
    """

    name = ""
    preempt = False  # whether :meth:`victims` may name any
    balanced_prefill = False
    wait_for_computing = False  # hold a request whose next block a running one computes

    def __init__(self, max_bypass: int = DEFAULT_MAX_BYPASS) -> None:
        if max_bypass < 0:
            raise ValueError(f"max_bypass must be >= 0, got {max_bypass}")
        self.max_bypass = max_bypass
        self._bypassed: dict[int, int] = {}  # id(entry) -> times overtaken
        self._notes = _QueueNotes()
        self._requests: dict[int, _Built] = {}  # id(entry) -> its view, see _request_of
        self._quiet: _Quiet | None = None  # the last call, if it tried and changed nothing
        self._queue: list[Waiting] = []  # the queue _forget_gone last saw
        self._views: dict[int, AdmitRequest] = {}  # id(entry) -> its view, for _queue

    def rank(self, kv: KVManager, waiting: Sequence[E]) -> list[E]:
        """Return ``waiting`` in admission order (best first). Does not modify the cache."""
        raise NotImplementedError

    def deferred(
        self, kv: KVManager, waiting: Sequence[E], prefill_share: float | None = None
    ) -> set[int]:
        """Return ids of entries to hold back while the GPU has other work (none here)."""
        return set()

    def _rank(self, kv: KVManager, queue: list[E]) -> list[E]:
        """:meth:`rank` of the scheduler's own queue list (never modified); the result
        is read, not modified."""
        return self.rank(kv, queue)

    def _deferred(self, kv: KVManager, queue: list[E], prefill_share: float | None) -> set[int]:
        """:meth:`deferred` of the scheduler's own queue list (never modified); the
        result is read, not modified."""
        return self.deferred(kv, queue, prefill_share)

    def admit(
        self,
        kv: KVManager,
        waiting: deque[E],
        free_slots: int,
        *,
        on_admit: Callable[[E, Admission], None],
        on_reject: Callable[[E, EngineError], None],
        running: int = 0,
        prefill_share: float | None = None,
        retractable: Sequence[R] = (),
        on_retract: Callable[[R], None] | None = None,
    ) -> None:
        # one list of the queue, kept while the queue holds the same entries: an entry's
        # request and keys change only while it runs (see _forget_gone), so the caches
        # below that compare it with what they kept compare one object
        same = _same(waiting, self._queue)
        queue: list[E] = self._queue if same else list(waiting)  # type: ignore[assignment]
        # requests held back behind the cohort wait their turn: no near use of their
        # prefixes, so queue-aware eviction does not count them (see the module docstring)
        held = self._deferred(kv, queue, prefill_share)
        self._notes.note(kv, queue, ranked=True, snapshot=True, held=held)
        candidates = list(retractable) if on_retract is not None and self.preempt else []
        if not waiting or (free_slots <= 0 and not candidates):
            return
        if not same:
            self._forget_gone(queue)
        order = self._order(kv, queue)
        quiet = None
        if not candidates:
            settled, walks = kv.settled_version(), kv.waiting.version
            quiet = _Quiet(
                kv, settled, walks, kv.tree.version, order, held, bool(running), free_slots
            )
        if quiet is not None and quiet.same_as(self._quiet):
            assert self._quiet is not None
            kv.count_refusals(self._quiet.tried)  # what trying them again would count
            return
        tried = skipped = 0
        spare = _Spare()
        admitted: list[E] = []
        in_order = True  # every entry tried so far was admitted: this one goes next
        for i, entry in enumerate(order):
            may_retract = in_order and bool(candidates)
            if free_slots <= 0 and not may_retract:
                break
            # Held back while other work keeps the GPU busy, unless it fits in free and
            # retired space: then it costs no cached context and keeps the batch full.
            spare_only = id(entry) in held and bool(running or admitted)
            if self.wait_for_computing and kv.prefix_in_flight(entry.keys, entry.request.namespace):
                in_order = False  # a running request is computing its next block: wait for it
                continue
            if spare_only and free_slots > 0:
                if spare.version != kv.tree.version:  # what try_admit would refuse as is
                    views = self._views
                    rest = [views[id(e)] for e in order[i:] if id(e) in held]
                    spare.refused = kv.refusals(rest, retired_only=True)
                    spare.version = kv.tree.version
                if id(entry.keys) in spare.refused:
                    tried += 1
                    skipped += 1
                    continue
            try:
                admission = None
                if free_slots > 0:
                    tried += 1
                    admission = kv.try_admit(self._views[id(entry)], retired_only=spare_only)
                if admission is None and may_retract and not spare_only:
                    assert on_retract is not None
                    victims = self.victims(kv, entry, candidates, need_slot=free_slots <= 0)
                    for victim in victims:
                        candidates.remove(victim)
                        on_retract(victim)
                        free_slots += 1
                    if victims:
                        admission = kv.try_admit(admission_of(entry))
            except ValueError as exc:
                waiting.remove(entry)
                on_reject(entry, EngineError(f"request {entry.request.request_id}: {exc}"))
                continue
            if admission is None:
                if spare_only:
                    continue
                in_order = False
                if self._bypassed.get(id(entry), 0) >= self.max_bypass:
                    break  # it goes next: keep what frees up for it
                continue
            waiting.remove(entry)
            free_slots -= 1
            admitted.append(entry)
            on_admit(entry, admission)
        kv.count_refusals(skipped)
        self._count_bypasses(queue, held, waiting, admitted)
        if (
            quiet is not None
            and len(waiting) == len(queue)
            and quiet.tree_version == kv.tree.version
        ):
            quiet.tried = tried  # nothing admitted or rejected, and the tree as it was
        else:
            quiet = None
        self._quiet = quiet

    def _order(self, kv: KVManager, queue: list[E]) -> list[E]:
        """Return ``queue`` in the order to try it: requests overtaken ``max_bypass``
        times first, in arrival order, then the rest as :meth:`rank` orders them."""
        ranked = self._rank(kv, queue)
        if max(self._bypassed.values(), default=0) < self.max_bypass:
            return ranked
        starving = [e for e in queue if self._bypassed.get(id(e), 0) >= self.max_bypass]
        first = {id(e) for e in starving}
        return [*starving, *(e for e in ranked if id(e) not in first)]

    def _forget_gone(self, queue: list[Waiting]) -> None:
        """Remember ``queue`` and each entry's view (:meth:`_request_of`); drop what is
        kept for entries no longer queued.

        An entry changes only while it runs (a retraction gives it a new request and
        keys), and one that left the queue comes back only after a later call, so the
        views hold while the queue stays the same entries in the same order.
        """
        self._queue = queue  # held, so the ids below are not reused while it is
        live = {id(e) for e in queue}
        self._bypassed = {k: n for k, n in self._bypassed.items() if k in live}
        self._views = {id(e): self._request_of(e) for e in queue}
        if len(self._requests) > len(live):
            self._requests = {k: v for k, v in self._requests.items() if k in live}

    def _request_of(self, entry: Waiting) -> AdmitRequest:
        """Return :func:`admission_of` ``entry``, built once per queued entry: a request
        held back is tried on every step, and its view changes only when a retraction
        gives it a new request, keys and count."""
        built = self._requests.get(id(entry))
        if (
            built is not None
            and built.entry is entry  # held, so its id is not reused while cached
            and built.asked is entry.request
            and built.request.keys is entry.keys
            and built.request.resumed == (entry.retractions > 0)
        ):
            return built.request
        request = admission_of(entry)
        self._requests[id(entry)] = _Built(entry, entry.request, request)
        return request

    def victims(self, kv: KVManager, entry: E, running: Sequence[R], *, need_slot: bool) -> list[R]:
        """Return the running requests to retract so that ``entry`` fits (none here).

        Does not modify the cache.
        """
        return []

    def _count_bypasses(
        self,
        queue: Sequence[E],
        held: set[int],
        waiting: Sequence[E],
        admitted: Sequence[E],
    ) -> None:
        """Charge each still-waiting request of ``queue`` (the queue before admission,
        in arrival order) once per later arrival admitted before it; ``held`` entries
        are not charged and do not count as arrivals."""
        if not admitted:
            return
        arrival = {id(e): i for i, e in enumerate(queue) if id(e) not in held}
        for entry in waiting:
            mine = arrival.get(id(entry))
            if mine is None:
                continue
            later = sum(arrival.get(id(a), -1) > mine for a in admitted)
            if later:
                self._bypassed[id(entry)] = self._bypassed.get(id(entry), 0) + later


class LPMScheduler(_RankedScheduler):
    """Longest cached prefix (GPU, host or loading) first; arrival order on ties."""

    name = "lpm"

    def rank(self, kv: KVManager, waiting: Sequence[E]) -> list[E]:
        def cached(entry: E) -> int:
            return kv.queued_cached_blocks(entry.keys, entry.request.namespace)

        return sorted(waiting, key=lambda e: -cached(e))  # stable: arrival order on ties


class WorkflowScheduler(_RankedScheduler):
    """Oldest workflow first; a mostly cached request ahead of one that mostly recomputes.

    A request's *value* is the share of its prompt cached or loading. Requests are
    ranked by value band (``value_bands`` equal bands, the top band first), then by
    workflow age (the KV manager's start ordinal, the ranking queue-aware eviction also
    reads), then arrival. ``value_bands=1``
    ranks by age alone.

    With ``preempt``, a request that goes next and does not fit retracts running
    requests of younger workflows (see :meth:`victims`). Off by default, since it costs
    more than it gains at the paper's hover load (``docs/design.md``): a retraction
    shrinks the decode batch and its KV is reloaded or recomputed, and under closed-loop
    load latency follows throughput, not the order workflows are served in.

    Args:
        max_bypass: see :class:`_RankedScheduler`.
        value_bands: bands of the cached share, >= 1.
        cohort_fill: share of GPU + host capacity the cohort's contexts may fill
            (``None``: no cohort, nothing held back), > 0.
        preempt: retract younger workflows' running requests for the one that goes next.
        max_retractions: times one request may be retracted, >= 0.
        balanced_prefill: ask the engine for stall-free batches (see the module
            docstring).

    Raises:
        ValueError: ``value_bands < 1``, ``cohort_fill <= 0``, or negative
            ``max_bypass`` or ``max_retractions``.
    """

    name = "workflow"

    def __init__(
        self,
        max_bypass: int = DEFAULT_MAX_BYPASS,
        value_bands: int = 2,
        cohort_fill: float | None = DEFAULT_COHORT_FILL,
        *,
        engage_share: float = 0.5,
        release_share: float = 0.3,
        preempt: bool = False,
        max_retractions: int = DEFAULT_MAX_RETRACTIONS,
        balanced_prefill: bool = True,
    ) -> None:
        super().__init__(max_bypass)
        self.balanced_prefill = balanced_prefill
        self.wait_for_computing = balanced_prefill
        if not 0.0 <= release_share <= engage_share <= 1.0:
            raise ValueError(
                f"need 0 <= release_share <= engage_share <= 1, got {release_share}, {engage_share}"
            )
        if value_bands < 1:
            raise ValueError(f"value_bands must be >= 1, got {value_bands}")
        if cohort_fill is not None and cohort_fill <= 0:
            raise ValueError(f"cohort_fill must be > 0 or None, got {cohort_fill}")
        if max_retractions < 0:
            raise ValueError(f"max_retractions must be >= 0, got {max_retractions}")
        self.value_bands = value_bands
        self.cohort_fill = cohort_fill
        self.engage_share = engage_share
        self.release_share = release_share
        self._engaged = False
        self.preempt = preempt
        self.max_retractions = max_retractions
        self._context_tokens: dict[str, int] = {}
        # the active workflows by age, kept until the active set changes
        self._kv: KVManager | None = None
        self._active: list[str] = []
        self._active_version = -1  # the ScoreBoard.workflows_version _active was read at
        self._by_age: list[str] = []
        self._live: set[str] = set()
        # the last deferred() and rank() answers, reused while nothing they read changed
        self._held: set[int] = set()
        self._held_for: list[Waiting] = []
        self._ranked: list[Waiting] = []
        self._ranked_for: list[Waiting] = []
        self._ranked_ages: list[int] = []
        self._ranked_kv: KVManager | None = None
        self._ranked_version = -1
        self._ranked_ordinals = -1  # ScoreBoard.ordinals_version the ranking read

    def victims(self, kv: KVManager, entry: E, running: Sequence[R], *, need_slot: bool) -> list[R]:
        """Return the running requests to retract so that ``entry`` fits.

        Candidates are requests of workflows younger than ``entry``'s (a request outside
        any workflow ranks youngest) retracted fewer than ``max_retractions`` times,
        youngest workflow first, the latest admitted first within one. They are taken
        until the blocks they would give back cover ``entry``'s shortfall
        (:meth:`KVManager.release_gain` against :meth:`KVManager.gpu_shortfall`) and,
        with ``need_slot``, at least one is taken; if all of them would not make it fit,
        none is.

        Does not modify the cache.
        """
        age = _age(kv, entry)
        younger = [
            r
            for r in running
            if r.admission is not None
            and r.retractions < self.max_retractions
            and _age(kv, r) > age
        ]
        if not younger:
            return []
        request = admission_of(entry)
        short = kv.gpu_shortfall(request)
        if short <= 0 and not need_slot:
            return []  # it fits by blocks: something else keeps it out
        everyone = [r.admission for r in younger if r.admission is not None]
        if kv.release_gain(everyone, request) < short:
            return []  # retracting them all would not make it fit
        order = sorted(enumerate(younger), key=lambda ir: (-_age(kv, ir[1]), -ir[0]))
        chosen: list[R] = []
        for _, victim in order:
            chosen.append(victim)
            admissions = [v.admission for v in chosen if v.admission is not None]
            if kv.release_gain(admissions, request) >= short:
                return chosen
        return []

    def cohort(self, kv: KVManager, waiting: Sequence[E]) -> set[str]:
        """Return the oldest active workflows whose contexts fit in the cache together.

        A workflow's context is estimated by its latest queued prompt; the cohort is
        the longest run of workflows, oldest first, whose estimates sum to at most
        ``cohort_fill`` x (GPU + host capacity); never empty.
        """
        scores = kv.scores
        if kv is not self._kv or scores.workflows_version != self._active_version:
            # ages only change with the set
            active = scores.active_workflows
            self._kv, self._active, self._active_version = kv, active, scores.workflows_version
            self._by_age = sorted(active, key=scores.ordinal)
            self._live = live = set(active)
            self._context_tokens = {w: n for w, n in self._context_tokens.items() if w in live}
        live = self._live
        for entry in waiting:
            wid = entry.request.workflow_id
            if wid is not None and wid in live:
                self._context_tokens[wid] = len(entry.request.prompt_token_ids)
        assert self.cohort_fill is not None
        cfg = kv.config
        budget = self.cohort_fill * (cfg.gpu_capacity_blocks + cfg.host_capacity_blocks)
        budget *= cfg.block_size
        members: set[str] = set()
        used = 0
        for wid in self._by_age:
            used += self._context_tokens.get(wid, 0)
            if members and used > budget:
                break
            members.add(wid)
        return members

    def deferred(
        self, kv: KVManager, waiting: Sequence[E], prefill_share: float | None = None
    ) -> set[int]:
        """Hold back requests of workflows outside the cohort (see :meth:`cohort`) while
        recompute keeps the GPU busy.

        Holding back trades batch parallelism for cached contexts. That pays only while
        prefill (mostly recompute of evicted contexts) is what the GPU spends its time on;
        while decode dominates, running more workflows at once is worth more than their
        contexts. So the cohort engages when ``prefill_share`` reaches
        :attr:`engage_share`, and lets go when it falls below :attr:`release_share` with
        nobody held back: a cohort that holds requests back lowers the prefill share by
        its own success, which is no sign that the load has eased. An engine that does
        not measure the share (``None``) keeps the cohort engaged.
        """
        return set(self._deferred(kv, list(waiting), prefill_share))

    def _deferred(self, kv: KVManager, entries: list[E], prefill_share: float | None) -> set[int]:
        if self.cohort_fill is None:
            return set()
        if prefill_share is not None and not self._engaged:
            self._engaged = prefill_share >= self.engage_share
            if not self._engaged:
                return set()
        # the cohort reads the active workflows and the queue's prompts, nothing else
        if not (
            kv is self._kv
            and kv.scores.workflows_version == self._active_version
            and _same(entries, self._held_for)
        ):
            members = self.cohort(kv, entries)
            self._held_for = entries
            self._held = {
                id(e)
                for e in entries
                if e.request.workflow_id is not None and e.request.workflow_id not in members
            }
        if prefill_share is not None and prefill_share < self.release_share and not self._held:
            self._engaged = False
        return self._held

    def rank(self, kv: KVManager, waiting: Sequence[E]) -> list[E]:
        return list(self._rank(kv, list(waiting)))

    def _rank(self, kv: KVManager, entries: list[E]) -> list[E]:
        index, scores = kv.waiting, kv.scores
        # The ranking reads the queue, its index's cached lengths (current while the
        # index's version stays) and the workflows' ordinals (while their version stays,
        # the ages are the same and reading them again would assign none).
        if (
            kv is self._ranked_kv
            and index.version == self._ranked_version
            and scores.ordinals_version == self._ranked_ordinals
            and _same(entries, self._ranked_for)
        ):
            return self._ranked  # type: ignore[return-value]
        ordinal = scores.ordinal
        ages = [  # as eviction ranks
            NO_WORKFLOW if (wid := e.request.workflow_id) is None else ordinal(wid) for e in entries
        ]
        # cached lengths come from the queue's index when it holds this queue, current
        indexed = index.current and [id(e.keys) for e in entries] == index.order
        if (
            indexed
            and kv is self._ranked_kv
            and index.version == self._ranked_version
            and ages == self._ranked_ages
            and _same(entries, self._ranked_for)
        ):
            self._ranked_ordinals = scores.ordinals_version
            return self._ranked  # type: ignore[return-value]
        bs, bands = kv.config.block_size, self.value_bands
        # the index holds every entry's walk when ``indexed``; else walk the tree
        lookup = index.cached_blocks if indexed else kv.queued_cached_blocks
        keys = []
        for entry, age in zip(entries, ages, strict=True):
            cached = lookup(entry.keys, entry.request.namespace)
            if cached is None:
                cached = kv.queued_cached_blocks(entry.keys, entry.request.namespace)
            share = cached * bs / max(1, len(entry.request.prompt_token_ids))
            keys.append((-min(bands - 1, int(share * bands)), age))
        ranked = [entries[i] for i in sorted(range(len(entries)), key=keys.__getitem__)]
        if indexed:
            self._ranked_kv, self._ranked_version = kv, index.version
            self._ranked, self._ranked_for, self._ranked_ages = ranked, entries, ages
            self._ranked_ordinals = scores.ordinals_version
        else:
            self._ranked_version = -1
        return list(ranked)


def _same(a: Sequence[object], b: Sequence[object]) -> bool:
    """Return whether ``a`` and ``b`` hold the same objects in the same order."""
    return a is b or (len(a) == len(b) and all(map(operator.is_, a, b)))


def _age(kv: KVManager, entry: Waiting) -> int:
    """Return the start ordinal of ``entry``'s workflow (:data:`NO_WORKFLOW` if none)."""
    wid = entry.request.workflow_id
    return NO_WORKFLOW if wid is None else kv.scores.ordinal(wid)


def balanced_fcfs_scheduler() -> FCFSScheduler:
    """Return ``fcfs`` with stall-free batches (``fcfs-balanced``), which measures the
    share of a gain that batch composition alone gives."""
    scheduler = FCFSScheduler(balanced_prefill=True)
    scheduler.name = "fcfs-balanced"
    return scheduler


def retracting_workflow_scheduler() -> WorkflowScheduler:
    """Return the ``workflow`` scheduler with retraction on (``workflow-retract``)."""
    scheduler = WorkflowScheduler(preempt=True)
    scheduler.name = "workflow-retract"
    return scheduler


def continuum_scheduler() -> Scheduler:
    """Return Continuum's program-level FCFS, pinned programs first (``continuum``,
    :mod:`pbkv.engines.continuum`)."""
    from pbkv.engines.continuum import ContinuumScheduler

    return ContinuumScheduler()


def autellix_scheduler() -> Scheduler:
    """Return Autellix's program-level least-attained-service scheduler (``autellix``,
    :mod:`pbkv.engines.autellix`)."""
    from pbkv.engines.autellix import AutellixScheduler

    return AutellixScheduler()


SCHEDULERS: dict[str, Callable[[], Scheduler]] = {
    "fcfs": FCFSScheduler,
    "lpm": LPMScheduler,
    "workflow": WorkflowScheduler,
    "workflow-retract": retracting_workflow_scheduler,
    "fcfs-balanced": balanced_fcfs_scheduler,
    "continuum": continuum_scheduler,
    "autellix": autellix_scheduler,
}


def get_scheduler(name: str) -> Scheduler:
    """Return a new scheduler registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    try:
        factory = SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(SCHEDULERS)}") from None
    return factory()
