"""The time-aware score: a workflow's predicted reuse weighed by when it comes (issue 28).

PBKV's score (paper Eq. 2) says *whether* a workflow reuses a node, not *when*. Between
two of its calls a workflow waits on a tool or a user, from well under a second to
minutes, and a context idle for minutes holds GPU blocks a context back in a second
could use. Belady's rule evicts what is used farthest in the future; with a forecast of
*which* agent comes next (the score) and of *when* the workflow is back, the value of
keeping a workflow's context per unit of time it occupies the cache is its predicted
reuse divided by the wait. :class:`TimeWeights` scales each workflow's share of every
node's score by

    f_w = d / (d + r_w),    r_w = E[G - e | G > e]

``G`` the gap after the workflow's last call (learned online per agent whose request
ended, :class:`GapModel`), ``e`` the time it has waited so far, ``d`` the median gap of
all workflows (the time scale at which waiting matters). A workflow with a request
running or queued has ``f_w = 1``; so does every workflow while no gap has been seen
(the score is Eq. 2 exactly until there is evidence). As ``e`` grows, ``r_w`` follows
the observed distribution: it shrinks under light tails (the workflow is nearly back)
and grows under heavy ones (a workflow gone for minutes is likely gone for longer), so
the weight is refreshed at doubling waits (:meth:`TimeWeights.refresh`).

None of the anchors combines the two: KVFlow and PBKV rank by steps to execution or
predicted reuse, Continuum pins for a TTL from the tool's duration alone (arXiv
2511.02230), LRU reads only the past.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pbkv.kvmanager.scoring import ScoreBoard

GAP_WINDOW = 512
"""Gaps kept per agent and in the pooled window (the most recent; older ones forgotten)."""
OWN_SAMPLES = 16
"""Gaps an agent needs before its own distribution is used instead of the pooled one."""
MIN_SAMPLES = 8
"""Pooled gaps needed before any weight departs from 1 (fewer say little about time)."""
WEIGHT_STEP = 1.05
"""A refreshed weight moves the scores only when it differs from the applied one by more
than this factor (each move re-keys the workflow's nodes)."""
WORKFLOW_MEMORY = 65_536
"""Active workflows :class:`TimeWeights` tracks at most (the least recently active are
dropped, back to weight 1)."""


class _Window:
    """The last :data:`GAP_WINDOW` gaps of one key, sorted on demand (with prefix sums)."""

    __slots__ = ("recent", "_sorted", "_sums")

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=GAP_WINDOW)
        self._sorted: list[float] | None = None
        self._sums: list[float] = []

    def add(self, gap_s: float) -> None:
        self.recent.append(gap_s)
        self._sorted = None

    def sorted(self) -> tuple[list[float], list[float]]:
        """Return the gaps ascending and their suffix sums (``sums[i] = sum(gaps[i:])``)."""
        if self._sorted is None:
            gaps = sorted(self.recent)
            sums = [0.0] * (len(gaps) + 1)
            for i in range(len(gaps) - 1, -1, -1):
                sums[i] = sums[i + 1] + gaps[i]
            self._sorted, self._sums = gaps, sums
        return self._sorted, self._sums


class GapModel:
    """Gaps between a workflow's request ending and its next invocation, learned online.

    Keyed by the agent whose request ended (a tool is known by the agent that called it,
    as :mod:`pbkv.kvmanager.continuum` keys its tool durations), with a pooled window
    over every agent for agents seen too rarely.
    """

    def __init__(self) -> None:
        self._own: dict[str, _Window] = {}
        self._pooled = _Window()

    @property
    def samples(self) -> int:
        """Gaps in the pooled window."""
        return len(self._pooled.recent)

    def observe(self, agent: str, gap_s: float) -> None:
        """Add one gap (seconds, >= 0; a negative one is clamped to 0)."""
        gap_s = max(0.0, gap_s)
        self._own.setdefault(agent, _Window()).add(gap_s)
        self._pooled.add(gap_s)

    def typical_s(self) -> float | None:
        """Return the median pooled gap, seconds; ``None`` before :data:`MIN_SAMPLES`."""
        gaps, _ = self._pooled.sorted()
        if len(gaps) < MIN_SAMPLES:
            return None
        return gaps[len(gaps) // 2]

    def remaining_s(self, agent: str, elapsed_s: float) -> float | None:
        """Return ``E[G - e | G > e]`` after ``agent``'s request, ``e = elapsed_s``.

        From the agent's own gaps once it has :data:`OWN_SAMPLES`, else the pooled ones.
        When no observed gap is longer than ``e``, the workflow is expected to stay away
        as long again (``e``): nothing seen says it is nearly back.

        Returns:
            Seconds; ``None`` before :data:`MIN_SAMPLES` pooled gaps.
        """
        own = self._own.get(agent)
        window = own if own is not None and len(own.recent) >= OWN_SAMPLES else self._pooled
        if len(self._pooled.recent) < MIN_SAMPLES:
            return None
        gaps, sums = window.sorted()
        i = bisect.bisect_right(gaps, elapsed_s)
        longer = len(gaps) - i
        if longer == 0:
            return elapsed_s
        return max(0.0, sums[i] / longer - elapsed_s)  # >= 0 past float rounding


@dataclass(slots=True)
class _Away:
    """A tracked workflow: its running requests and, when none runs, its wait."""

    running: int = 0
    since_s: float | None = None  # when its last running request ended (None: not away)
    agent: str = ""  # whose request ended: the gap's key
    applied: float = 1.0  # the weight the score board holds
    due_s: float = math.inf  # next refresh


class TimeWeights:
    """Keep each workflow's time factor ``f_w`` on a :class:`ScoreBoard` current.

    Driven by the KV manager: :meth:`on_admitted` and :meth:`on_released` per request
    (:meth:`on_requeued` for one retracted to the queue), :meth:`on_invoked` per call,
    :meth:`on_terminated`, and :meth:`refresh` before eviction decisions. A retracted
    request's workflow keeps weight 1 while it is queued (it is not away) and counts as
    running again at readmission (the wait between is not observed as a gap).

    Args:
        board: the score board whose workflows' weights are scaled.
        clock: current time, seconds.
        gaps: the gap model (a fresh one by default).
    """

    def __init__(
        self, board: ScoreBoard, clock: Callable[[], float], gaps: GapModel | None = None
    ) -> None:
        self.board = board
        self.clock = clock
        self.gaps = gaps or GapModel()
        self._workflows: dict[str, _Away] = {}
        self._due: list[tuple[float, int, str]] = []  # (due_s, seq, workflow); stale skipped
        self._seq = itertools.count()
        self.refreshes = 0
        """Weights applied to the board (each re-keys the workflow's nodes)."""

    def weight(self, workflow_id: str) -> float:
        """Return the weight the board holds for ``workflow_id`` (1 when untracked)."""
        state = self._workflows.get(workflow_id)
        return 1.0 if state is None else state.applied

    def on_admitted(self, workflow_id: str) -> None:
        """A request of ``workflow_id`` was admitted: it is not away (weight 1)."""
        state = self._state(workflow_id)
        state.running += 1
        self._back(workflow_id, state)

    def on_invoked(self, workflow_id: str) -> None:
        """``workflow_id`` calls again: its gap, if it was away, is observed and ends."""
        state = self._workflows.get(workflow_id)
        if state is None:
            return
        if state.since_s is not None:
            known = self.gaps.samples >= MIN_SAMPLES
            self.gaps.observe(state.agent, self.clock() - state.since_s)
            if not known and self.gaps.samples >= MIN_SAMPLES:
                self._first_weights(workflow_id)
        self._back(workflow_id, state)

    def on_requeued(self, workflow_id: str) -> None:
        """A request of ``workflow_id`` was retracted and queued again: it stops running
        but the workflow is not away (it waits for a slot, not on a tool or a user)."""
        state = self._workflows.get(workflow_id)
        if state is not None and state.running > 0:
            state.running -= 1

    def on_released(self, workflow_id: str, agent: str) -> None:
        """A request of ``workflow_id`` by ``agent`` ended; with none left running, the
        workflow starts waiting (its gap's key is ``agent``)."""
        state = self._workflows.get(workflow_id)
        if state is None or state.running == 0:
            return
        state.running -= 1
        if state.running == 0:
            state.since_s, state.agent = self.clock(), agent
            self._apply(workflow_id, state)

    def on_terminated(self, workflow_id: str) -> None:
        """Forget ``workflow_id`` (the board drops its weights itself)."""
        self._workflows.pop(workflow_id, None)

    def refresh(self) -> int:
        """Re-weigh every waiting workflow whose refresh is due. Returns how many."""
        now, due, done = self.clock(), self._due, 0
        while due and due[0][0] <= now:
            due_s, _, workflow_id = heapq.heappop(due)
            state = self._workflows.get(workflow_id)
            if state is None or state.due_s != due_s or state.since_s is None:
                continue  # stale entry
            self._apply(workflow_id, state)
            done += 1
        return done

    def factor(self, agent: str, elapsed_s: float) -> float:
        """Return ``d / (d + r)`` for a wait of ``elapsed_s`` after ``agent``'s request
        (1 before the gap model has :data:`MIN_SAMPLES` gaps or when ``d`` is 0)."""
        typical_s = self.gaps.typical_s()
        remaining_s = self.gaps.remaining_s(agent, elapsed_s)
        if typical_s is None or remaining_s is None or typical_s <= 0.0:
            return 1.0
        return min(1.0, typical_s / (typical_s + remaining_s))

    # -- helpers ---------------------------------------------------------------------

    def _state(self, workflow_id: str) -> _Away:
        state = self._workflows.pop(workflow_id, None) or _Away()
        self._workflows[workflow_id] = state  # most recently active last
        while len(self._workflows) > WORKFLOW_MEMORY:
            oldest = next(iter(self._workflows))
            self._set(oldest, self._workflows.pop(oldest), 1.0)
        return state

    def _first_weights(self, invoked: str) -> None:
        """The gap model just reached :data:`MIN_SAMPLES`: weigh every workflow already
        waiting (their waits began while no weight could be given, so none has a refresh
        due), all but ``invoked``, which is back."""
        for workflow_id, state in self._workflows.items():
            if workflow_id != invoked and state.since_s is not None:
                self._apply(workflow_id, state)

    def _back(self, workflow_id: str, state: _Away) -> None:
        state.since_s, state.due_s = None, math.inf
        self._set(workflow_id, state, 1.0)

    def _apply(self, workflow_id: str, state: _Away) -> None:
        """Set the weight for the wait so far and schedule the next refresh at twice
        the wait (at least the typical gap from now)."""
        assert state.since_s is not None
        now = self.clock()
        elapsed_s = now - state.since_s
        self._set(workflow_id, state, self.factor(state.agent, elapsed_s))
        step_s = max(elapsed_s, self.gaps.typical_s() or 0.0)
        if step_s > 0.0:
            state.due_s = now + step_s
            heapq.heappush(self._due, (state.due_s, next(self._seq), workflow_id))

    def _set(self, workflow_id: str, state: _Away, weight: float) -> None:
        applied = state.applied
        if weight == applied:
            return
        if weight != 1.0 and max(weight, applied) < WEIGHT_STEP * min(weight, applied):
            return
        self.board.set_time_weight(workflow_id, weight)
        state.applied = weight
        self.refreshes += 1
