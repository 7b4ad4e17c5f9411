"""Belady's farthest-next-use order, estimated from the whole workload known in advance (§5.2).

The ``belady-est`` policy: evict the entry whose next use is *estimated* to lie farthest
in the future. It is an estimate, not a bound (demand policies can beat it); the exact
offline MIN over a run's recorded access order is :mod:`pbkv.kvmanager.bounds`. With
many workflows in flight, "future" is estimated in seconds: each workflow step carries
its start offset from the workflow's start (tool gaps plus the modelled time of the
steps before it), so a node's next use is the nearest upcoming invocation, of a running
workflow or of one not started yet, whose prompt contains the node's last block key. A
running workflow's progress is anchored at the clock time its current step was
invoked; the ``r``-th pending workflow is expected to start after ``(r + 1) /
concurrency`` mean workflow durations (a slot frees that often on average). The
estimate is written to each node's ``hint`` before evictions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from pbkv.kvmanager.node import Node

NEVER = 1e18
"""Next-use distance of a block no remaining invocation reads."""


class FutureStep(NamedTuple):
    """One upcoming invocation: its prompt's block keys and start offset in its workflow."""

    keys: Sequence[int]
    offset_s: float


class BeladyTracker:
    """Next-use distances from the full workload.

    Args:
        future: workflow id → its steps in order, in submission order of the workflows.
        concurrency: workflows in flight at once (to place pending workflows in time).
        nodes: returns every node of the tree (re-keyed before evictions).
        reprioritize: called with each node whose ``hint`` changed.
        clock: current time in seconds.
    """

    def __init__(
        self,
        future: Mapping[str, Sequence[FutureStep]],
        concurrency: int,
        nodes: Callable[[], list[Node]],
        reprioritize: Callable[[Node], None],
        clock: Callable[[], float],
    ) -> None:
        self._uses: dict[int, list[tuple[str, int]]] = {}
        for w, steps in future.items():
            for s, step in enumerate(steps):
                for key in step.keys:
                    self._uses.setdefault(key, []).append((w, s))
        self._offsets = {w: [step.offset_s for step in steps] for w, steps in future.items()}
        self._order = {w: i for i, w in enumerate(future)}
        durations = [o[-1] for o in self._offsets.values() if o]
        self._mean_duration_s = sum(durations) / len(durations) if durations else 0.0
        self._concurrency = max(1, concurrency)
        self._invoked: dict[str, tuple[int, float]] = {}
        self._done: set[str] = set()
        self._nodes = nodes
        self._reprioritize = reprioritize
        self._clock = clock
        self._refreshed_at: float | None = None
        self.refresh_interval_s = 1.0

    def on_agent_invoked(self, workflow_id: str, step: int) -> None:
        self._invoked[workflow_id] = (step, self._clock())
        self._refreshed_at = None

    def on_terminated(self, workflow_id: str) -> None:
        self._done.add(workflow_id)
        self._refreshed_at = None

    def next_use_s(self, node: Node) -> float:
        """Return the estimated seconds until ``node``'s next use (:data:`NEVER` if none)."""
        now = self._clock()
        best = NEVER
        for w, s in self._uses.get(node.keys[-1], ()):
            if w in self._done:
                continue
            offsets = self._offsets[w]
            current = self._invoked.get(w)
            if current is None:
                rank = max(0, self._order[w] - len(self._invoked))
                d = self._mean_duration_s * (rank + 1) / self._concurrency + offsets[s]
            elif s >= current[0]:
                d = max(0.0, offsets[s] - offsets[current[0]] - (now - current[1]))
            else:
                continue
            best = min(best, d)
        return best

    def refresh(self) -> None:
        """Re-key every node with its next use.

        Skipped when no workflow advanced and less than :attr:`refresh_interval_s` of
        clock time passed since the last refresh: next uses drift with time only by the
        same amount for every running workflow, and a full re-key per eviction makes
        long runs quadratic.
        """
        now = self._clock()
        last = self._refreshed_at
        if last is not None and now - last < self.refresh_interval_s:
            return
        self._refreshed_at = now
        for node in self._nodes():
            hint = self.next_use_s(node)
            if not math.isclose(hint, node.hint):
                node.hint = hint
                self._reprioritize(node)
