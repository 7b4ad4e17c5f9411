"""Autellix's admission: program-level least attained service, preemptive (§7.0).

Autellix (Luo et al., "Autellix: An Efficient Serving Engine for LLM Agents as General
Programs", arXiv 2502.13965, §4.2) schedules LLM calls by the service their *program*
has already received, so a short program is not stuck behind a long one (program-level
head-of-line blocking):

- **PLAS** (single-threaded programs): a call's priority is its program's attained
  service, the summed service time of its completed calls; least first.
- **ATLAS** (multi-threaded programs, fan-out): a call's priority is the attained
  service along the program's critical path, ``p(c) = max over parents k of p(k) + t_k``.
  We do not see a program's call graph, only its calls, so a call's parents are taken to
  be every call of its program completed when it arrives; along a chain the values only
  grow, so the maximum is that of the longest completed chain. On a sequential program
  ATLAS and PLAS agree.
- **Discretised priorities** (§4.2.2): priorities fall into ``levels`` queues, level
  ``i >= 1`` holding ``[q * r^(i-1), q * r^i)`` seconds of service (``q`` =
  ``base_quantum_s``, ``r`` = ``quantum_ratio``), level 0 ``[0, q)``; first come first
  served within a level.
- **Anti-starvation**: a program whose total waiting time ``W`` reaches ``beta`` times
  its total service ``T`` (``W / T >= beta``, ``beta`` = ``starvation_ratio``) is
  promoted to level 0 until it is served.
- **Preemption**: when the call that goes next does not fit, running calls of programs
  at a lower level (more attained service, counting the running call's own) are
  retracted, lowest level first, just enough to make it fit (the engine keeps what they
  computed, §7.0).

Service is measured in (virtual) seconds a call spends admitted, from the KV manager's
clock. Eviction is the engine's default (``lru:autellix``). The paper's quantum and
``beta`` values are not restated here; ours are this module's defaults. Queued calls
are tried past one that does not fit, with bounded bypass, as every ranked scheduler
here (:class:`~pbkv.engines.ranked._RankedScheduler`), and batches are balanced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from pbkv.engines.admission import Running, Waiting
from pbkv.engines.ranked import (
    DEFAULT_MAX_BYPASS,
    DEFAULT_MAX_RETRACTIONS,
    _RankedScheduler,
    fewest_victims,
)
from pbkv.kvmanager import Admission, KVManager

E = TypeVar("E", bound=Waiting)
R = TypeVar("R", bound=Running)

Mode = Literal["plas", "atlas"]

DEFAULT_BASE_QUANTUM_S = 1.0
"""Upper end of level 0, seconds of attained service."""
DEFAULT_QUANTUM_RATIO = 2.0
"""Each level's range is this many times the one before."""
DEFAULT_LEVELS = 16
"""Priority queues (the last is unbounded above, from ``q * r^14`` = 4.5 hours at the
defaults): a call admitted under load serves tens of seconds, so with 8 levels (above
128 s) most programs shared the last level and the ranking fell back to FCFS."""
DEFAULT_STARVATION_RATIO = 3.0
"""``beta``: waiting this many times its service promotes a program to level 0."""


@dataclass(slots=True)
class _Program:
    total_s: float = 0.0  # PLAS: summed service of completed calls
    path_s: float = 0.0  # ATLAS: longest completed chain of service
    waited_s: float = 0.0  # queueing time of its admitted calls


@dataclass(frozen=True, slots=True)
class _Call:
    """A running call: its program, when it was admitted, and its priority then."""

    program: str
    admission: Admission
    admitted_s: float
    base_s: float


class AutellixScheduler(_RankedScheduler):
    """Admit in ascending program attained service (see the module docstring).

    Args:
        max_bypass: see :class:`~pbkv.engines.ranked._RankedScheduler`.
        mode: ``atlas`` (critical path; PLAS on sequential programs) or ``plas`` (sum).
        base_quantum_s / quantum_ratio / levels: the discretised queues, > 0, > 1, >= 1.
        starvation_ratio: ``beta`` > 0.
        preempt: retract lower-level running calls for the call that goes next.
        max_retractions: times one call may be retracted, >= 0.
        balanced_prefill: ask the engine for stall-free batches.

    Raises:
        ValueError: an argument out of its range (named).
    """

    name = "autellix"

    def __init__(
        self,
        max_bypass: int = DEFAULT_MAX_BYPASS,
        *,
        mode: Mode = "atlas",
        base_quantum_s: float = DEFAULT_BASE_QUANTUM_S,
        quantum_ratio: float = DEFAULT_QUANTUM_RATIO,
        levels: int = DEFAULT_LEVELS,
        starvation_ratio: float = DEFAULT_STARVATION_RATIO,
        preempt: bool = True,
        max_retractions: int = DEFAULT_MAX_RETRACTIONS,
        balanced_prefill: bool = True,
    ) -> None:
        super().__init__(
            max_bypass,
            preempt=preempt,
            max_retractions=max_retractions,
            balanced_prefill=balanced_prefill,
        )
        if mode not in ("plas", "atlas"):
            raise ValueError(f"mode must be 'plas' or 'atlas', got {mode!r}")
        if base_quantum_s <= 0 or quantum_ratio <= 1 or levels < 1:
            raise ValueError(
                "need base_quantum_s > 0, quantum_ratio > 1, levels >= 1; got "
                f"{base_quantum_s}, {quantum_ratio}, {levels}"
            )
        if starvation_ratio <= 0:
            raise ValueError(f"starvation_ratio must be > 0, got {starvation_ratio}")
        self.mode = mode
        self.base_quantum_s = base_quantum_s
        self.quantum_ratio = quantum_ratio
        self.levels = levels
        self.starvation_ratio = starvation_ratio
        self._programs: dict[str, _Program] = {}
        self._running: dict[int, _Call] = {}  # id(admission) -> call
        self._seen: dict[int, tuple[Waiting, float]] = {}  # id(entry) -> (entry, queued at)
        self._now = 0.0  # the clock when the current admission call began

    # -- priorities ------------------------------------------------------------------

    def attained_s(self, program: str) -> float:
        """Return the attained service that ranks ``program``'s next call (``mode``'s).

        Does not modify anything.
        """
        state = self._programs.get(program)
        if state is None:
            return 0.0
        return state.path_s if self.mode == "atlas" else state.total_s

    def level(self, attained_s: float) -> int:
        """Return the queue level of ``attained_s`` seconds of service (0 is served first)."""
        if attained_s < self.base_quantum_s:
            return 0
        steps = math.log(attained_s / self.base_quantum_s) / math.log(self.quantum_ratio)
        return min(self.levels - 1, 1 + math.floor(steps))

    def starving(self, program: str, waiting_s: float) -> bool:
        """Return whether ``program`` has waited ``beta`` times its service, counting the
        ``waiting_s`` its queued call has waited so far."""
        state = self._programs.get(program)
        if state is None or state.total_s <= 0.0:
            return False  # no service yet: level 0 already
        return (state.waited_s + waiting_s) / state.total_s >= self.starvation_ratio

    def rank(self, kv: KVManager, waiting: Sequence[E]) -> list[E]:
        """Return ``waiting`` by level (a starving program's at 0), arrival within one.

        Does not modify the cache.
        """
        now = kv.tree.clock()

        def key(entry: E) -> int:
            program = _program_of(entry)
            queued_s = now - self._queued_at(entry, now)
            if self.starving(program, queued_s):
                return 0
            return self.level(self.attained_s(program))

        return sorted(waiting, key=key)  # stable: arrival order within a level

    def victims(self, kv: KVManager, entry: E, running: Sequence[R], *, need_slot: bool) -> list[R]:
        """Return the running calls to retract so that ``entry`` fits.

        Candidates are calls retracted fewer than ``max_retractions`` times whose
        program's level, counting the call's own service so far, is below ``entry``'s;
        taken the lowest level first, the latest admitted first within one, as
        :func:`~pbkv.engines.ranked.fewest_victims` takes them.

        Does not modify the cache.
        """
        now = kv.tree.clock()
        program = _program_of(entry)
        queued_s = now - self._queued_at(entry, now)
        mine = 0 if self.starving(program, queued_s) else self.level(self.attained_s(program))
        ranked = []
        for order, r in enumerate(running):
            call = self._running.get(id(r.admission)) if r.admission is not None else None
            if call is None or r.retractions >= self.max_retractions:
                continue
            theirs = self.level(call.base_s + (now - call.admitted_s))
            if theirs > mine:
                ranked.append((-theirs, -order, r))
        ordered = [r for _, _, r in sorted(ranked, key=lambda t: (t[0], t[1]))]
        return fewest_victims(kv, entry, ordered, need_slot=need_slot)

    # -- admission (the ranked scheduler's hooks) --------------------------------------

    def _before_admit(self, kv: KVManager, waiting: Sequence[Waiting]) -> None:
        """Account the calls that ended since the last call (their service) and stamp
        newly queued ones; each call admitted now is recorded with this clock reading.

        Mutates: the programs' service records.
        """
        self._now = now = kv.tree.clock()
        self._settle(now)
        self._note_arrivals(waiting, now)

    def _started(self, entry: Waiting, admission: Admission) -> None:
        self._start(entry, admission, self._now)

    def _note_arrivals(self, waiting: Sequence[Waiting], now: float) -> None:
        """Stamp newly queued entries with ``now``; forget entries no longer queued."""
        live = {id(e) for e in waiting}
        self._seen = {k: v for k, v in self._seen.items() if k in live}
        for entry in waiting:
            self._seen.setdefault(id(entry), (entry, now))

    def _queued_at(self, entry: Waiting, now: float) -> float:
        seen = self._seen.get(id(entry))
        return seen[1] if seen is not None and seen[0] is entry else now

    def _start(self, entry: Waiting, admission: Admission, now: float) -> None:
        program = _program_of(entry)
        state = self._programs.setdefault(program, _Program())
        state.waited_s += max(0.0, now - self._queued_at(entry, now))
        self._seen.pop(id(entry), None)
        self._running[id(admission)] = _Call(program, admission, now, self.attained_s(program))

    def _settle(self, now: float) -> None:
        """Add each call that ended (its admission released) to its program's service."""
        ended = [c for c in self._running.values() if c.admission.done]
        for call in ended:
            del self._running[id(call.admission)]
            served_s = max(0.0, now - call.admitted_s)
            state = self._programs.setdefault(call.program, _Program())
            state.total_s += served_s
            state.path_s = max(state.path_s, call.base_s + served_s)


def _program_of(entry: Waiting) -> str:
    """Return the program a queued call belongs to (a call outside any is its own)."""
    request = entry.request
    return request.workflow_id if request.workflow_id is not None else f"#{request.request_id}"
