"""Belady's farthest-next-use order, from the whole workload known in advance (§5.2).

The offline upper bound on hit rate: evict the entry whose next use lies farthest in
the future. With many workflows running concurrently, "future" is counted in steps: a
node's next use is the nearest upcoming invocation (of any workflow, running or not yet
started) whose prompt contains the node's last block key; a step of a running workflow
``s - t`` steps ahead counts ``s - t``; a workflow not started yet counts the steps
until it is expected to start (its rank among pending workflows over the concurrency,
times the mean workflow length) plus its step index. The estimate is written to each
node's ``hint`` before every eviction (refreshed only when some workflow advanced).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from pbkv.kvmanager.node import Node

NEVER = 1e18
"""Next-use distance of a block no remaining invocation reads."""


class BeladyTracker:
    """Next-use distances from the full workload.

    Args:
        future: workflow id → per step, the block keys of that step's prompt, in
            submission order of the workflows.
        concurrency: workflows in flight at once (to place pending workflows in time).
        nodes: returns every node of the tree (refreshed before evictions).
        reprioritize: called with each node whose ``hint`` changed.
    """

    def __init__(
        self,
        future: Mapping[str, Sequence[Sequence[int]]],
        concurrency: int,
        nodes: Callable[[], list[Node]],
        reprioritize: Callable[[Node], None],
    ) -> None:
        self._uses: dict[int, list[tuple[str, int]]] = {}
        for w, steps in future.items():
            for s, keys in enumerate(steps):
                for key in keys:
                    self._uses.setdefault(key, []).append((w, s))
        self._order = {w: i for i, w in enumerate(future)}
        lengths = [len(steps) for steps in future.values()]
        self._mean_steps = sum(lengths) / len(lengths) if lengths else 1.0
        self._concurrency = max(1, concurrency)
        self._position: dict[str, int] = {}
        self._done: set[str] = set()
        self._started = 0
        self._nodes = nodes
        self._reprioritize = reprioritize
        self._dirty = True

    def on_agent_invoked(self, workflow_id: str, step: int) -> None:
        if workflow_id not in self._position:
            self._started += 1
        self._position[workflow_id] = step
        self._dirty = True

    def on_terminated(self, workflow_id: str) -> None:
        self._done.add(workflow_id)
        self._dirty = True

    def next_use(self, node: Node) -> float:
        """Return the steps until ``node``'s next use (:data:`NEVER` if none)."""
        best = NEVER
        for w, s in self._uses.get(node.keys[-1], ()):
            if w in self._done:
                continue
            pos = self._position.get(w)
            if pos is None:
                rank = self._order[w] - self._started
                d = self._mean_steps * (1 + max(0, rank) / self._concurrency) + s
            elif s >= pos:
                d = float(s - pos)
            else:
                continue
            best = min(best, d)
        return best

    def refresh(self) -> None:
        """Recompute every node's hint if any workflow advanced since the last refresh."""
        if not self._dirty:
            return
        self._dirty = False
        for node in self._nodes():
            hint = self.next_use(node)
            if not math.isclose(hint, node.hint):
                node.hint = hint
                self._reprioritize(node)
