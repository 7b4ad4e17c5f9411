"""The schedulers' shared machinery: the base every scheduler extends, arrival order, and
ranked admission with bounded bypass (§7.0).

:class:`Scheduler` holds the engines' one entry point, :meth:`Scheduler.admit`.
:class:`FCFSScheduler` admits in an order its subclasses may change (arrival order
here), stopping at the first request that does not fit. :class:`_RankedScheduler`
admits in :meth:`~_RankedScheduler.rank` order, tries requests past one that does not
fit, and lets a request overtaken ``max_bypass`` times go first, blocking the queue
behind it until it fits, so none starves; it also holds back what
:meth:`~_RankedScheduler.deferred` names (unless :meth:`~_RankedScheduler._released`
lets it in) and retracts what :meth:`~_RankedScheduler.victims` names. The registry is
in :mod:`pbkv.engines.scheduler`.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from pbkv.engines.admission import ForwardCosts, Running, Waiting, admission_of, admit_in_order
from pbkv.engines.base import EngineError, GenerateRequest
from pbkv.kvmanager import Admission, AdmitRequest, KVManager
from pbkv.kvmanager.node import NO_WORKFLOW

E = TypeVar("E", bound=Waiting)
R = TypeVar("R", bound=Running)

DEFAULT_MAX_BYPASS = 32
"""Times a queued request may be overtaken before it blocks everything behind it."""


_NONE: frozenset[int] = frozenset()

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
    order entries are tried in, which of them are held back (and which of those are let
    in all the same, ``released``), the free batch slots and
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
    released: Collection[int]
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
            and other.released == self.released
            and _same(other.order, self.order)
        )


@dataclass(slots=True)
class _Spare:
    """Held entries' keys (``id``) that a retired-only admission would refuse as things
    stand at tree ``version`` (:meth:`KVManager.refusals`)."""

    version: int = -1
    refused: set[int] = field(default_factory=set)


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


class AdmitCall(NamedTuple):
    """One admission call's callbacks and what the engine says of its state (the
    keyword arguments of :meth:`Scheduler.admit`)."""

    on_admit: Callable[[Any, Admission], None]
    on_reject: Callable[[Any, EngineError], None]
    running: int = 0
    prefill_share: float | None = None
    costs: ForwardCosts | None = None
    retractable: Sequence[Any] = ()
    on_retract: Callable[[Any], None] | None = None


class Scheduler:
    """Admits queued requests through the KV manager while batch slots remain (§7.0).

    The base of every scheduler: :meth:`admit` is the engines' one entry point, and a
    scheduler implements ``_admit``.
    """

    name = ""
    balanced_prefill = False
    """Whether the engine should cap each step's prefill at what the decode batch's
    compute slack carries (stall-free batching) instead of its fixed chunk size, and
    commit each chunk as it lands. The sim engine sizes that slack with its cost model,
    the torch engine with its measured step costs; where a decode step hides less than a
    block of prefill (a CPU), both keep the fixed chunk."""
    preempt = False
    """Whether the scheduler may retract running requests (the engine lists them only
    then)."""

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
        costs: ForwardCosts | None = None,
        retractable: Sequence[R] = (),
        on_retract: Callable[[R], None] | None = None,
    ) -> None:
        """Admit what fits, in the scheduler's order; ``running`` requests hold the GPU,
        which spent ``prefill_share`` of its recent time on prefill (``None``: unknown)
        and whose forwards cost ``costs`` now (``None``: unknown).

        A scheduler that retracts may pause some of ``retractable`` (running requests
        the engine can pause now) through ``on_retract``, which must commit, release
        and requeue the request (appending it to ``waiting``) before it returns.

        Mutates: ``waiting`` (admitted and rejected entries leave it, retracted ones
        join it) and the KV manager.
        """
        call = AdmitCall(
            on_admit, on_reject, running, prefill_share, costs, retractable, on_retract
        )
        self._admit(kv, waiting, free_slots, call)

    def _admit(self, kv: KVManager, waiting: deque[E], free_slots: int, call: AdmitCall) -> None:
        raise NotImplementedError


class FCFSScheduler(Scheduler):
    """Admit in :meth:`rank` order (arrival order here); stop at the first request that does
    not fit, reject one that never can and go on (:func:`admit_in_order`); never retract.

    Args:
        balanced_prefill: ask the engine for stall-free batches.
    """

    name = "fcfs"

    def __init__(self, *, balanced_prefill: bool = False) -> None:
        self.balanced_prefill = balanced_prefill
        self._notes = _QueueNotes()

    def rank(self, kv: KVManager, waiting: deque[E]) -> Sequence[E]:
        """Return ``waiting`` in the order to try it (arrival order: SGLang's and vLLM's
        default). Does not modify the cache."""
        return waiting

    def _admit(self, kv: KVManager, waiting: deque[E], free_slots: int, call: AdmitCall) -> None:
        """Admit in :meth:`rank` order while slots remain (see the class docstring)."""
        self._notes.note(kv, waiting)
        if not waiting or free_slots <= 0:
            return
        order = self.rank(kv, waiting)
        admit_in_order(
            kv, waiting, order, free_slots, on_admit=call.on_admit, on_reject=call.on_reject
        )


class _RankedScheduler(Scheduler):
    """Admit in :meth:`rank` order with bounded bypass.

    Entries :meth:`deferred` names are admitted only when nothing runs and nothing else
    was admitted in the same call (work-conserving), and are not charged bypasses while
    deferred. With ``preempt``, a request that goes next and does not fit retracts the
    running requests :meth:`victims` names.

    Args:
        max_bypass: times a request may be overtaken by a later arrival before it goes
            first and blocks the queue behind it until it fits, >= 0.
        preempt: retract running requests for the one that goes next.
        max_retractions: times one request may be retracted, >= 0.
        balanced_prefill: ask the engine for stall-free batches (and hold a request
            whose next block a running one computes until it is committed).

    Raises:
        ValueError: negative ``max_bypass`` or ``max_retractions``.
    """

    name = ""

    def __init__(
        self,
        max_bypass: int = DEFAULT_MAX_BYPASS,
        *,
        preempt: bool = False,
        max_retractions: int = DEFAULT_MAX_RETRACTIONS,
        balanced_prefill: bool = False,
    ) -> None:
        if max_bypass < 0:
            raise ValueError(f"max_bypass must be >= 0, got {max_bypass}")
        if max_retractions < 0:
            raise ValueError(f"max_retractions must be >= 0, got {max_retractions}")
        self.max_bypass = max_bypass
        self.preempt = preempt  # whether victims() may name any
        self.max_retractions = max_retractions
        self.balanced_prefill = balanced_prefill
        self.wait_for_computing = balanced_prefill
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

    def _released(
        self,
        kv: KVManager,
        queue: list[E],
        held: set[int],
        running: int,
        costs: ForwardCosts | None,
    ) -> Collection[int]:
        """Return the ids of ``held`` entries whose hold does not pay with ``running``
        requests running and forwards costing ``costs``: they are tried as if not held,
        though queue-aware eviction still does not count them (none here)."""
        return _NONE

    def _rank(self, kv: KVManager, queue: list[E]) -> list[E]:
        """:meth:`rank` of the scheduler's own queue list (never modified); the result
        is read, not modified."""
        return self.rank(kv, queue)

    def _deferred(self, kv: KVManager, queue: list[E], prefill_share: float | None) -> set[int]:
        """:meth:`deferred` of the scheduler's own queue list (never modified); the
        result is read, not modified."""
        return self.deferred(kv, queue, prefill_share)

    def _admit(self, kv: KVManager, waiting: deque[E], free_slots: int, call: AdmitCall) -> None:
        """Admit what fits in :meth:`_order`, holding back what :meth:`deferred` names and
        retracting what :meth:`victims` names (see the class docstring)."""
        running, on_retract = call.running, call.on_retract
        self._before_admit(kv, waiting)
        # one list of the queue, kept while the queue holds the same entries: an entry's
        # request and keys change only while it runs (see _forget_gone), so the caches
        # below that compare it with what they kept compare one object
        same = _same(waiting, self._queue)
        queue: list[E] = self._queue if same else list(waiting)  # type: ignore[assignment]
        # requests held back behind the cohort wait their turn: no near use of their
        # prefixes, so queue-aware eviction does not count them (see the module docstring)
        held = self._deferred(kv, queue, call.prefill_share)
        self._notes.note(kv, queue, ranked=True, snapshot=True, held=held)
        candidates = list(call.retractable) if on_retract is not None and self.preempt else []
        if not waiting or (free_slots <= 0 and not candidates):
            return
        if not same:
            self._forget_gone(queue)
        order = self._order(kv, queue)
        released = self._released(kv, queue, held, running, call.costs) if held else _NONE
        holding = held - released if released else held  # tried only in spare room
        quiet = None
        if not candidates:
            settled, walks = kv.settled_version(), kv.waiting.version
            quiet = _Quiet(
                kv,
                settled,
                walks,
                kv.tree.version,
                order,
                held,
                released,
                bool(running),
                free_slots,
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
            spare_only = id(entry) in holding and bool(running or admitted)
            if self.wait_for_computing and kv.prefix_in_flight(entry.keys, entry.request.namespace):
                in_order = False  # a running request is computing its next block: wait for it
                continue
            if spare_only and free_slots > 0:
                if spare.version != kv.tree.version:  # what try_admit would refuse as is
                    views = self._views
                    rest = [views[id(e)] for e in order[i:] if id(e) in holding]
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
                call.on_reject(entry, EngineError(f"request {entry.request.request_id}: {exc}"))
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
            self._started(entry, admission)
            call.on_admit(entry, admission)
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

    def _before_admit(self, kv: KVManager, waiting: Sequence[Waiting]) -> None:
        """Bring what the ranking reads up to date before a call admits (nothing here)."""

    def _started(self, entry: Waiting, admission: Admission) -> None:
        """Note that ``entry`` was admitted as ``admission`` (nothing here)."""

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


def fewest_victims(
    kv: KVManager, entry: Waiting, ordered: Sequence[R], *, need_slot: bool
) -> list[R]:
    """Return the shortest prefix of ``ordered`` whose retraction makes ``entry`` fit.

    ``ordered`` lists running requests in the order a scheduler would retract them.
    They are taken until the blocks they would give back cover ``entry``'s shortfall
    (:meth:`KVManager.release_gain` against :meth:`KVManager.gpu_shortfall`) and, with
    ``need_slot``, at least one is taken; if all of them would not make it fit, none is.

    Does not modify the cache.
    """
    if not ordered:
        return []
    request = admission_of(entry)
    short = kv.gpu_shortfall(request)
    if short <= 0 and not need_slot:
        return []  # it fits by blocks: something else keeps it out
    everyone = [r.admission for r in ordered if r.admission is not None]
    if kv.release_gain(everyone, request) < short:
        return []  # retracting them all would not make it fit
    chosen: list[R] = []
    for victim in ordered:
        chosen.append(victim)
        admissions = [v.admission for v in chosen if v.admission is not None]
        if kv.release_gain(admissions, request) >= short:
            return chosen
    return []


def _same(a: Sequence[object], b: Sequence[object]) -> bool:
    """Return whether ``a`` and ``b`` hold the same objects in the same order."""
    return a is b or (len(a) == len(b) and all(map(operator.is_, a, b)))


def _age(kv: KVManager, entry: Waiting) -> int:
    """Return the start ordinal of ``entry``'s workflow (:data:`NO_WORKFLOW` if none)."""
    wid = entry.request.workflow_id
    return NO_WORKFLOW if wid is None else kv.scores.ordinal(wid)
