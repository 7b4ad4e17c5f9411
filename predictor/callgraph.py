"""The app's call graph ``G = (V, E)`` and its transition matrix ``A`` (§6).

Agents are the nodes; an edge ``a -> b`` says agent ``b`` may run right after ``a``
(``a -> a`` loops are allowed) and ``a -> END`` says the workflow may end after ``a``.
Matrices index the agents in :attr:`CallGraph.agents` order with ``END`` last; the
``END`` row is absorbing (``END -> END`` with probability 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from pbkv.predictor.trace import END, TraceRecord
from pbkv.predictor.vocab import agent_index, check_agent, check_path

EDGE_HINT = (
    "an app with fan-out runs its branches concurrently and a trace steps between them: "
    "widen the graph with CallGraph(agents, edges).widened(traces), or use the 'online' "
    "forecaster, which learns transitions as it serves"
)
"""What to do when a trace takes a transition the declared graph lacks."""


class CallGraph:
    """Which agent may follow which.

    Args:
        agents: the nodes, in matrix order (``END`` excluded).
        edges: admissible ``(source, target)`` transitions; ``target`` may be ``END``.

    Raises:
        ValueError: ``agents`` is empty or repeats a name, or an edge names an unknown
            agent or leaves ``END``.
    """

    def __init__(self, agents: Sequence[str], edges: Iterable[tuple[str, str]]) -> None:
        self.agents: tuple[str, ...] = tuple(agents)
        self._index = agent_index(self.agents)
        n = len(self.agents) + 1
        self._admissible = np.zeros((n, n), dtype=bool)
        self._admissible[-1, -1] = True
        for source, target in edges:
            src = check_agent(self._index, source)
            dst = check_agent(self._index, target, allow_end=True)
            self._admissible[src, dst] = True
        self._admissible.flags.writeable = False

    @classmethod
    def from_traces(
        cls, records: Iterable[TraceRecord], agents: Sequence[str] | None = None
    ) -> CallGraph:
        """Build the graph of the transitions the traces take.

        Args:
            records: traces; each contributes its consecutive agent pairs and
                ``last -> END``.
            agents: the node order; by default the sorted names seen in ``records``.

        Returns:
            A graph whose edges are exactly the observed transitions.

        Raises:
            ValueError: a trace names an agent outside ``agents``, or no agent is seen.
        """
        paths = [r.agents for r in records if r.steps]
        edges = {pair for path in paths for pair in _transitions(path)}
        if agents is None:
            agents = sorted({a for path in paths for a in path})
        return cls(agents, edges)

    def widened(self, records: Iterable[TraceRecord]) -> tuple[CallGraph, int]:
        """Return this graph plus the transitions ``records`` take that it lacks, and how
        many those are (``self`` and 0 when none).

        A fan-out's branches run concurrently, and a trace lists them one after another:
        it steps from a branch to its sibling and from the last branch to the join, in
        orders no declared edge states. A graph widened by an app's own runs admits them.

        Raises:
            ValueError: a trace names an agent outside this graph.
        """
        seen = CallGraph.from_traces(records, self.agents)
        added = seen.admissible & ~self.admissible
        count = int(added.sum())
        if not count:
            return self, 0
        names = (*self.agents, END)
        both = self.admissible | seen.admissible
        edges = [(names[a], names[b]) for a, b in zip(*np.nonzero(both[:-1]), strict=True)]
        return CallGraph(self.agents, edges), count

    @property
    def admissible(self) -> np.ndarray:
        """Read-only boolean matrix, shape ``(|V|+1, |V|+1)``: ``[a, b]`` is edge ``a -> b``."""
        return self._admissible

    def index(self, agent: str) -> int:
        """Return ``agent``'s row (``END`` is ``len(agents)``).

        Raises:
            ValueError: ``agent`` is not a node.
        """
        return check_agent(self._index, agent, allow_end=True)

    def successors(self, agent: str) -> tuple[str, ...]:
        """Return the agents (and ``END``) that may follow ``agent``, in matrix order.

        Raises:
            ValueError: ``agent`` is not a node.
        """
        names = (*self.agents, END)
        row = self._admissible[self.index(agent)]
        return tuple(names[j] for j in np.flatnonzero(row))

    def is_admissible(self, source: str, target: str) -> bool:
        """Return whether ``target`` may run right after ``source``.

        Raises:
            ValueError: either name is not a node.
        """
        return bool(self._admissible[self.index(source), self.index(target)])

    def validate_path(self, path: Sequence[str]) -> None:
        """Check that ``path`` only names nodes and only takes edges.

        Raises:
            ValueError: ``path`` is empty, names an unknown agent, or takes a transition
                that is not an edge (the message names it).
        """
        check_path(self._index, path)
        for source, target in zip(path, path[1:], strict=False):
            self._check_edge(source, target)

    def count_transitions(self, records: Iterable[TraceRecord]) -> np.ndarray:
        """Count each transition in ``records``, ``last -> END`` included.

        Args:
            records: traces over this graph's agents; empty traces are ignored.

        Returns:
            int64 matrix, shape ``(|V|+1, |V|+1)``; the ``END`` row is zero.

        Raises:
            ValueError: a trace names an unknown agent or takes a transition (``last ->
                END`` included) that is not an edge.
        """
        n = len(self.agents) + 1
        counts = np.zeros((n, n), dtype=np.int64)
        for record in records:
            if not record.steps:
                continue
            check_path(self._index, record.agents)
            for source, target in _transitions(record.agents):
                counts[self._check_edge(source, target)] += 1
        return counts

    def _check_edge(self, source: str, target: str) -> tuple[int, int]:
        """Return the matrix cell of edge ``source -> target``; raise if it is no edge."""
        cell = self.index(source), self.index(target)
        if not self._admissible[cell]:
            raise ValueError(f"transition {source!r} -> {target!r} is not an edge; {EDGE_HINT}")
        return cell

    def transition_matrix(
        self, records: Iterable[TraceRecord], smoothing: float = 0.0
    ) -> np.ndarray:
        """Estimate ``A``: row-normalised transition counts over the admissible edges.

        Each admissible entry gets ``smoothing`` added to its count. A row with no mass
        (no observations and no smoothing) is uniform over its successors, and an agent
        with no successors at all moves to ``END``. The ``END`` row is absorbing.

        Args:
            records: traces over this graph's agents.
            smoothing: additive (Laplace) pseudo-count per admissible edge, ``>= 0``.

        Returns:
            float64 matrix, shape ``(|V|+1, |V|+1)``; every row sums to 1 and is zero
            outside the admissible edges (bar the ``END`` fallback above).

        Raises:
            ValueError: ``smoothing < 0``, or as :meth:`count_transitions`.
        """
        if smoothing < 0:
            raise ValueError(f"smoothing must be >= 0, got {smoothing}")
        mass = self.count_transitions(records) + smoothing * self._admissible
        mass[-1] = 0.0
        mass[-1, -1] = 1.0
        empty = mass.sum(axis=1) == 0
        mass[empty] = self._admissible[empty]
        mass[~mass.any(axis=1), -1] = 1.0
        return mass / mass.sum(axis=1, keepdims=True)

    def __repr__(self) -> str:
        return f"CallGraph(agents={self.agents!r}, edges={int(self._admissible.sum()) - 1})"


def _transitions(path: Sequence[str]) -> list[tuple[str, str]]:
    """Return the consecutive pairs of ``path`` followed by ``(last, END)``."""
    return [*zip(path, path[1:], strict=False), (path[-1], END)]
