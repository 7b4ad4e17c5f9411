"""Continuum's baseline: pin a multi-turn program's KV on the GPU across its tool call (§5.2).

Continuum (Li et al., "Continuum: Efficient and Robust Multi-Turn LLM Agent Scheduling
with KV Cache Time-to-Live", arXiv 2511.02230, v6 §4; preview code
``github.com/Hanchenli/vllm-continuum``, ``vllm/v1/core/sched/scheduler.py``): when a
request of a program finishes and the program will call again after a tool, the
request's KV is *pinned* in GPU memory for a time-to-live ``tau``. Pinned blocks are
held, not merely ranked: nothing evicts them until the TTL expires or the program's next
request is admitted (it then holds them itself). A pin whose TTL expired while the
program's next request already waits in the queue is kept until that request is
admitted (the fork's ``unpin_requests_regular``). Eviction of everything unpinned is the
engine's default (LRU); admission is program-level FCFS with pinned programs first
(:class:`pbkv.engines.continuum.ContinuumScheduler`).

The TTL maximises the expected utility of pinning (v6 §4.2, Eq. 2):

    tau* = argmax_tau  F_tool(tau) * B - tau,    B = eta * Q + R(context)

``F_tool`` is the distribution of the tool's duration, learned online from the gaps this
tracker observes (a request's end to its program's next invocation); ``Q`` the mean
queueing delay of a follow-up request whose KV was not retained; ``R`` the time to bring
the context back (reload from the host tier: blocks x bytes per block / host-to-GPU
bandwidth); ``eta = -Corr(k, N - k)`` the *memoryfulness* of the programs' turn counts
(how well a program's turns so far predict the turns it has left), over the completed
programs' turn boundaries. With at most :data:`COLD_START_SAMPLES` durations seen, the
paper's cold start applies: ``F`` is an Exp(1 s) and ``eta = 1``, so ``tau* = ln B`` for
``B > 1`` s, else 0; past it, the tool's own empirical distribution when it has more than
:data:`COLD_START_SAMPLES` samples, else every tool's.

Our workflows carry no tool names, so a tool is known by the agent whose request ended
(the agent that issued the call): the closest reading of the fork's parse of the tool
name from the output. The windows of queue delays and completed programs are not given
in the paper (:data:`QUEUE_WINDOW`, :data:`PROGRAM_WINDOW`).

If no request is running and a queued request does not fit beside the pins, pins are
released earliest deadline first until it does (the fork's deadlock guard): pinned
memory never stalls an idle engine.

Plain synchronous code (no trio), driven by :class:`~pbkv.kvmanager.KVManager`.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pbkv.kvmanager.radix import Lease, RadixTree

if TYPE_CHECKING:
    from pbkv.kvmanager.manager import Admission, AdmitRequest

COLD_START_SAMPLES = 100
"""Durations seen (all tools, then one tool) up to which the prior, not the empirical
distribution, is used (v6 §4.2)."""

PRIOR_MEAN_S = 1.0
"""Mean of the cold-start Exp prior on tool durations, seconds (v6 §4.2)."""

QUEUE_WINDOW = 256
"""Queue delays averaged into ``Q`` (a sliding window; its length is not in the paper)."""

PROGRAM_WINDOW = 256
"""Completed programs whose turn counts give ``eta`` (its length is not in the paper)."""

ENDED_MEMORY = 4096
"""Terminated programs remembered, so a late request of one is never pinned."""


def prior_ttl_s(benefit_s: float, mean_s: float = PRIOR_MEAN_S) -> float:
    """Return the TTL maximising ``(1 - exp(-tau / mean_s)) * benefit_s - tau``.

    The utility of Eq. 2 under an Exp prior of mean ``mean_s``: ``mean_s * ln(B /
    mean_s)`` for ``B > mean_s``, else 0 (pinning never pays).
    """
    return mean_s * math.log(benefit_s / mean_s) if benefit_s > mean_s else 0.0


def empirical_ttl_s(durations_s: Sequence[float], benefit_s: float) -> float:
    """Return the TTL maximising ``F(tau) * benefit_s - tau`` over the empirical ``F``.

    ``F`` only steps up at a sample, so the maximum is at 0 or at a sample; ties go to
    the smaller TTL (less pinned memory).

    Args:
        durations_s: observed durations, sorted ascending, non-empty.
        benefit_s: ``B`` of Eq. 2.
    """
    n = len(durations_s)
    best_s = 0.0
    best = bisect.bisect_right(durations_s, 0.0) / n * benefit_s
    i = 0
    while i < n:
        tau = durations_s[i]
        i = bisect.bisect_right(durations_s, tau, lo=i)  # samples <= tau
        reward = i / n * benefit_s - tau
        if reward > best:
            best_s, best = tau, reward
    return best_s


def memoryfulness(turn_counts: Iterable[int]) -> float:
    """Return ``eta = -Corr(k, N - k)`` over each completed program's turn boundaries
    ``k = 1 .. N - 1`` (where a pin is decided), clipped to [-1, 1]; 1 (the paper's cold
    value) when the correlation is undefined."""
    n = sx = sy = sxx = syy = sxy = 0.0
    for total in turn_counts:
        for k in range(1, total):
            x, y = float(k), float(total - k)
            n += 1
            sx, sy = sx + x, sy + y
            sxx, syy, sxy = sxx + x * x, syy + y * y, sxy + x * y
    if n < 2:
        return 1.0
    vx, vy = sxx - sx * sx / n, syy - sy * sy / n
    if vx <= 0.0 or vy <= 0.0:
        return 1.0
    corr = (sxy - sx * sy / n) / math.sqrt(vx * vy)
    return max(-1.0, min(1.0, -corr))


@dataclass(eq=False, slots=True)
class Pin:
    """A program's finished request held on the GPU until ``deadline_s``."""

    workflow_id: str
    lease: Lease
    deadline_s: float


@dataclass(slots=True)
class _Program:
    turns: int = 0  # invocations seen
    admitted: int = 0  # requests admitted (resumptions of retracted ones not counted)
    pins: list[Pin] = field(default_factory=list)
    finished_s: float | None = None  # when its last request ended: its tool call began
    tool: str = ""  # the agent whose request ended: the tool's key
    arrived_s: float | None = None  # its next request, invoked and not yet admitted
    retained: bool = False  # a pin held when that request arrived


@dataclass(frozen=True, slots=True)
class ContinuumStatistics:
    """What the tracker did: pins taken, how they ended, and the TTL model's inputs."""

    pins: int
    pinned_now: int
    expired: int
    released_by_next_request: int
    released_by_end: int
    released_idle: int
    tool_samples: int
    queue_delay_s: float
    eta: float


class ContinuumTracker:
    """Pin programs' KV across tool calls for a TTL (see the module docstring).

    Args:
        tree: the radix tree whose leases hold pinned KV.
        reload_s_per_block: seconds to bring one block back (``R`` per block).
        shortfall: GPU blocks a request lacks now (:meth:`KVManager.gpu_shortfall`).
    """

    def __init__(
        self,
        tree: RadixTree,
        *,
        reload_s_per_block: float,
        shortfall: Callable[[AdmitRequest], int],
    ) -> None:
        self.tree = tree
        self.reload_s_per_block = reload_s_per_block
        self._shortfall = shortfall
        self._programs: dict[str, _Program] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._heap: list[tuple[float, int, Pin]] = []  # pins by deadline (stale ones skipped)
        self._live: set[int] = set()  # id() of pins not yet released
        self._seq = itertools.count()
        self._running = 0
        self._durations: dict[str, list[float]] = {}  # tool -> sorted durations
        self._all_durations: list[float] = []  # sorted
        self._queue_delays: deque[float] = deque(maxlen=QUEUE_WINDOW)
        self._turn_counts: deque[int] = deque(maxlen=PROGRAM_WINDOW)
        self.eta = 1.0
        self._pins = self._expired = self._by_next = self._by_end = self._idle = 0

    # -- the TTL (v6 §4.2) -------------------------------------------------------------

    @property
    def queue_delay_s(self) -> float:
        """``Q``: the mean queueing delay of follow-up requests not retained."""
        delays = self._queue_delays
        return sum(delays) / len(delays) if delays else 0.0

    def ttl_s(self, tool: str, context_blocks: int) -> float:
        """Return the TTL to pin a context of ``context_blocks`` blocks across ``tool``.

        Does not modify anything.
        """
        reload_s = context_blocks * self.reload_s_per_block
        if len(self._all_durations) <= COLD_START_SAMPLES:
            return prior_ttl_s(self.queue_delay_s + reload_s)  # cold start: eta = 1
        benefit_s = self.eta * self.queue_delay_s + reload_s
        own = self._durations.get(tool, [])
        durations = own if len(own) > COLD_START_SAMPLES else self._all_durations
        return empirical_ttl_s(durations, benefit_s)

    def observe_duration(self, tool: str, duration_s: float) -> None:
        """Add one tool duration to ``F`` (its tool's and the global). Mutates the model."""
        bisect.insort(self._durations.setdefault(tool, []), duration_s)
        bisect.insort(self._all_durations, duration_s)

    def observe_queue_delay(self, delay_s: float) -> None:
        """Add one not-retained follow-up's queueing delay to ``Q``'s window."""
        self._queue_delays.append(delay_s)

    def observe_program(self, turns: int) -> None:
        """Add a completed program's turn count to ``eta``'s window."""
        self._turn_counts.append(turns)
        self.eta = memoryfulness(self._turn_counts)

    # -- lifecycle -------------------------------------------------------------------

    def pinned(self, workflow_id: str | None) -> bool:
        """Return whether ``workflow_id`` holds a pin now. Does not modify anything."""
        program = self._programs.get(workflow_id) if workflow_id is not None else None
        return program is not None and bool(program.pins)

    def on_agent_invoked(self, workflow_id: str) -> None:
        """Note ``workflow_id``'s next request: the tool call before it ended now.

        Mutates: the duration model and the program's waiting state.
        """
        program = self._program(workflow_id)
        if program is None:
            return
        now = self.tree.clock()
        program.turns += 1
        if program.finished_s is not None:
            self.observe_duration(program.tool, max(0.0, now - program.finished_s))
            program.finished_s = None
        if program.admitted < program.turns:  # else admitted before the event came
            program.arrived_s = now
            program.retained = bool(program.pins)

    def on_admitted(self, request: AdmitRequest) -> None:
        """Count a running request; a program's next request takes over its pins.

        Mutates: pins (released: the request's own lease now holds its prefix), ``Q``.
        """
        self._running += 1
        workflow_id = request.workflow_id
        program = self._program(workflow_id) if workflow_id is not None else None
        if program is None:
            return
        if not request.resumed:  # a retracted request coming back is no new turn
            program.admitted += 1
        if program.arrived_s is not None and not request.resumed:
            if not program.retained:
                self.observe_queue_delay(self.tree.clock() - program.arrived_s)
            program.arrived_s = None
        self._by_next += self._unpin_all(program)

    def on_released(self, admission: Admission) -> None:
        """Pin a finished request's KV for its TTL (before its own lease is released).

        A request that did not finish its prefill (failed or cancelled early) and a
        request outside any program, or of one that has ended, is not pinned.

        Mutates: the tree (a lease on the request's deepest committed node).
        """
        self._running -= 1
        request = admission.request
        workflow_id = request.workflow_id
        program = self._program(workflow_id) if workflow_id is not None else None
        if program is None or admission.committed_blocks < len(request.keys):
            return
        now = self.tree.clock()
        program.finished_s, program.tool = now, request.agent
        node = admission.lease.node
        if node.is_root:
            return
        ttl_s = self.ttl_s(request.agent, admission.committed_blocks)
        if ttl_s <= 0.0:
            return
        assert workflow_id is not None
        pin = Pin(workflow_id, self.tree.lock(node), now + ttl_s)
        program.pins.append(pin)
        self._live.add(id(pin))
        heapq.heappush(self._heap, (pin.deadline_s, next(self._seq), pin))
        self._pins += 1

    def on_terminated(self, workflow_id: str) -> None:
        """End a program: release its pins, add its turn count to ``eta``."""
        self._ended[workflow_id] = None
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)
        program = self._programs.pop(workflow_id, None)
        if program is None:
            return
        self._by_end += self._unpin_all(program)
        if program.turns:
            self.observe_program(program.turns)

    # -- expiry and the idle guard ---------------------------------------------------

    def expire(self) -> int:
        """Release every pin past its deadline whose program has no request waiting.

        Returns:
            Pins released.

        Mutates: the tree (leases released).
        """
        now = self.tree.clock()
        heap, released = self._heap, 0
        kept: list[tuple[float, int, Pin]] = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            pin = entry[2]
            if id(pin) not in self._live:
                continue
            program = self._programs.get(pin.workflow_id)
            if program is not None and program.arrived_s is not None:
                kept.append(entry)  # its next request waits: held until admitted
                continue
            self._unpin(pin)
            released += 1
        for entry in kept:  # overdue: looked at again on every call until released
            heapq.heappush(heap, entry)
        self._expired += released
        return released

    def relieve(self, request: AdmitRequest) -> int:
        """If no request runs and ``request`` does not fit beside the pins, release pins,
        earliest deadline first, until it does or none is left.

        Returns:
            Pins released.

        Mutates: the tree (leases released).
        """
        if self._running > 0 or not self._live:
            return 0
        released = 0
        while self._heap and self._shortfall(request) > 0:
            pin = heapq.heappop(self._heap)[2]
            if id(pin) in self._live:
                self._unpin(pin)
                released += 1
        self._idle += released
        return released

    def before_admit(self, request: AdmitRequest) -> None:
        """Do :meth:`expire` and :meth:`relieve` before ``request`` is tried."""
        if self._live:
            self.expire()
            self.relieve(request)

    # -- observation -----------------------------------------------------------------

    def statistics(self) -> ContinuumStatistics:
        """Return a snapshot of the counters. Does not modify anything."""
        return ContinuumStatistics(
            pins=self._pins,
            pinned_now=len(self._live),
            expired=self._expired,
            released_by_next_request=self._by_next,
            released_by_end=self._by_end,
            released_idle=self._idle,
            tool_samples=len(self._all_durations),
            queue_delay_s=self.queue_delay_s,
            eta=self.eta,
        )

    def check_integrity(self) -> None:
        """Assert that every live pin is a live lease of its program and the running
        count is not negative."""
        pins = [p for program in self._programs.values() for p in program.pins]
        if {id(p) for p in pins} != self._live or any(p.lease.released for p in pins):
            raise AssertionError(f"{len(self._live)} live pins, {len(pins)} held by programs")
        if self._running < 0:
            raise AssertionError(f"running count {self._running} < 0")

    # -- helpers ---------------------------------------------------------------------

    def _program(self, workflow_id: str) -> _Program | None:
        """Return the state of an active program, created on first sight (``None`` for
        one that has ended)."""
        program = self._programs.get(workflow_id)
        if program is None and workflow_id not in self._ended:
            program = self._programs[workflow_id] = _Program()
        return program

    def _unpin(self, pin: Pin) -> None:
        self._live.discard(id(pin))
        program = self._programs.get(pin.workflow_id)
        if program is not None:
            program.pins.remove(pin)
        self.tree.unlock(pin.lease)

    def _unpin_all(self, program: _Program) -> int:
        pins = list(program.pins)
        for pin in pins:
            self._unpin(pin)
        return len(pins)
