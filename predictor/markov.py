"""Order-n Markov forecaster over agent paths (``markov-n``, §6).

The model counts which agent (or ``END``) follows each context of the last ``m``
agents, ``m = 0..n`` (``m = 0`` pools every transition). A next-step distribution uses
the longest context of the path that has been seen, backing off to shorter ones, with
additive smoothing over the transitions the call graph admits. A ``K``-step forecast
rolls the distribution over order-n contexts forward and, following the convention of
:mod:`pbkv.predictor.base`, reports each step conditional on the workflow being alive
before it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from pbkv.predictor.base import WorkflowState
from pbkv.predictor.callgraph import EDGE_HINT, CallGraph
from pbkv.predictor.trace import END, TraceRecord
from pbkv.predictor.vocab import agent_index, check_agent, check_path

MAX_ORDER = 3

Context = tuple[int, ...]


class MarkovForecaster:
    """A smoothed order-n Markov chain with backoff, updatable online.

    Args:
        agents: the agent vocabulary, in column order (``END`` is appended).
        order: ``n``, how many trailing agents form a context, 1 to 3.
        horizon: ``K``, steps forecast.
        smoothing: additive pseudo-count ``alpha >= 0`` per admissible next step.
        graph: the app's call graph; when given, probability (smoothing included) goes
            only to its edges and observed transitions must be edges. Its agents must
            be the same set as ``agents``.

    Raises:
        ValueError: a bad ``order``, ``horizon`` or ``smoothing``, a bad vocabulary, or a
            graph over different agents.
    """

    def __init__(
        self,
        agents: Sequence[str],
        *,
        order: int = 1,
        horizon: int = 3,
        smoothing: float = 0.0,
        graph: CallGraph | None = None,
    ) -> None:
        if not 1 <= order <= MAX_ORDER:
            raise ValueError(f"order must be 1 to {MAX_ORDER}, got {order}")
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        if smoothing < 0:
            raise ValueError(f"smoothing must be >= 0, got {smoothing}")
        self.name = f"markov-{order}"
        self.agents: tuple[str, ...] = tuple(agents)
        self.horizon = horizon
        self.order = order
        self.smoothing = smoothing
        self._index = agent_index(self.agents)
        self._mask = _successor_mask(self.agents, graph)
        self._counts: dict[Context, np.ndarray] = {}
        self._cache: dict[Context, np.ndarray] = {}
        self._rolls: dict[Context, np.ndarray] = {}

    def fit(self, records: Iterable[TraceRecord]) -> MarkovForecaster:
        """Forget all counts, then count every transition of ``records``.

        Args:
            records: traces; each contributes its consecutive transitions and
                ``last -> END``. Empty traces are ignored.

        Returns:
            ``self``.

        Raises:
            ValueError: a trace names an unknown agent or takes a non-edge transition;
                the model is then left as it was.

        Mutates:
            the model's counts.
        """
        counts: dict[Context, np.ndarray] = {}
        for record in records:
            if not record.steps:
                continue
            check_path(self._index, record.agents)
            columns = [self._index[a] for a in record.agents]
            for t in range(1, len(columns) + 1):
                nxt = columns[t] if t < len(columns) else len(self.agents)
                self._observe(counts, tuple(columns[max(0, t - self.order) : t]), nxt)
        self._counts = counts
        self._cache.clear()
        self._rolls.clear()
        return self

    def update(self, path: Sequence[str], next_agent: str) -> None:
        """Count one observed transition (online learning).

        Args:
            path: the agents executed so far; only the last ``order`` matter.
            next_agent: the agent that ran next, or ``END``.

        Raises:
            ValueError: an unknown agent, or (with a graph) a transition that is not an edge.

        Mutates:
            the model's counts.
        """
        check_path(self._index, path)
        nxt = check_agent(self._index, next_agent, allow_end=True)
        self._observe(self._counts, self._context(path), nxt)
        self._cache.clear()
        self._rolls.clear()

    def conditional(self, path: Sequence[str]) -> np.ndarray:
        """Return the distribution of the step right after ``path``.

        Args:
            path: the agents executed so far (non-empty).

        Returns:
            float64 array, shape ``(|V|+1,)``, summing to 1 (``END`` last).

        Raises:
            ValueError: ``path`` is empty or names an unknown agent.
        """
        check_path(self._index, path)
        return self._conditional(self._context(path)).copy()

    def forecast(self, states: Sequence[WorkflowState]) -> np.ndarray:
        """Forecast the next ``K`` steps of each workflow (conditional on alive per step).

        Row ``k-1`` is ``P(step t+k = x | alive before t+k)``: the chain's marginal mass
        on ``x`` at step ``t+k`` divided by the mass still alive before that step. Once
        the chain has surely ended, rows are ``END`` one-hot.

        Args:
            states: one per workflow; only ``path`` is used.

        Returns:
            float64 array, shape ``(len(states), K, |V|+1)``; each row sums to 1.

        Raises:
            ValueError: a path is empty or names an unknown agent.
        """
        out = np.empty((len(states), self.horizon, len(self.agents) + 1))
        for b, state in enumerate(states):
            check_path(self._index, state.path)
            context = self._context(state.path)
            rolled = self._rolls.get(context)
            if rolled is None:
                rolled = self._rolls[context] = self._roll(context)
            out[b] = rolled
        return out

    def _context(self, path: Sequence[str]) -> Context:
        return tuple(self._index[a] for a in path[-self.order :])

    def _observe(self, counts: dict[Context, np.ndarray], context: Context, nxt: int) -> None:
        """Count ``context -> nxt`` in ``counts`` under every suffix of ``context``."""
        if not self._mask[context[-1], nxt]:
            names = (*self.agents, END)
            raise ValueError(
                f"transition {names[context[-1]]!r} -> {names[nxt]!r} is not an edge; {EDGE_HINT}"
            )
        for m in range(len(context) + 1):
            key = context[len(context) - m :]
            if key not in counts:
                counts[key] = np.zeros(len(self.agents) + 1)
            counts[key][nxt] += 1

    def _roll(self, start: Context) -> np.ndarray:
        """Roll the context distribution ``K`` steps forward from ``start``."""
        rows = np.zeros((self.horizon, len(self.agents) + 1))
        contexts: dict[Context, float] = {start: 1.0}
        for k in range(self.horizon):
            marginal = np.zeros(len(self.agents) + 1)
            following: dict[Context, float] = defaultdict(float)
            for context, mass in contexts.items():
                p = self._conditional(context)
                marginal += mass * p
                for agent in np.flatnonzero(p[:-1]):
                    following[(*context, int(agent))[-self.order :]] += mass * p[agent]
            alive = marginal.sum()
            if alive > 0:
                rows[k] = marginal / alive
            else:
                rows[k, -1] = 1.0
            contexts = following
        return rows

    def _conditional(self, context: Context) -> np.ndarray:
        """Next-step distribution after ``context``, backing off to shorter contexts."""
        cached = self._cache.get(context)
        if cached is None:
            cached = self._cache[context] = self._estimate(context)
        return cached

    def _estimate(self, context: Context) -> np.ndarray:
        allowed = self._mask[context[-1]]
        if not allowed.any():
            return _end_one_hot(len(self.agents))
        for m in range(len(context), -1, -1):
            counts = self._counts.get(context[len(context) - m :])
            if counts is not None and counts[allowed].sum() > 0:
                mass = np.where(allowed, counts + self.smoothing, 0.0)
                return mass / mass.sum()
        return allowed / allowed.sum()


def _successor_mask(agents: tuple[str, ...], graph: CallGraph | None) -> np.ndarray:
    """Admissible next steps per current agent, in ``agents`` order: ``(|V|+1, |V|+1)``."""
    n = len(agents) + 1
    if graph is None:
        return np.ones((n, n), dtype=bool)
    if set(graph.agents) != set(agents):
        raise ValueError(f"graph agents {sorted(graph.agents)} differ from agents {sorted(agents)}")
    order = [graph.index(a) for a in (*agents, END)]
    return graph.admissible[np.ix_(order, order)]


def _end_one_hot(num_agents: int) -> np.ndarray:
    row = np.zeros(num_agents + 1)
    row[-1] = 1.0
    return row
