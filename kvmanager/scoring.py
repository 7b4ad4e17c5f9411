"""PBKV's predicted reuse score, kept current incrementally (paper Eq. 2–4, §5.3).

For node ``c``, active workflows ``W_act(c)`` that touched it, forecast rows ``P_w^(k)``
(conditional per step, see :mod:`pbkv.predictor.base`), access indicator ``A_w(c)``,
survival ``s_w^(k) = prod_{j<k} (1 - P_w^(j)[END])`` and decay ``gamma``::

    Score(c) = sum_{k=1..K} gamma^(k-1) sum_{w in W_act(c)} s_w^(k) (A_w(c) . P_w^(k))
             = sum_{w in W_act(c)} sum_{a in A_w(c)} u_w[a],
    u_w[a]   = sum_k gamma^(k-1) s_w^(k) P_w^(k)[a].

So a forecast for ``w`` changes only the nodes ``w`` touched, each by
``sum_{a in A_w(c)} (u_new[a] - u_old[a])``; that is the whole refresh.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from math import isfinite
from operator import mul

import numpy as np

from pbkv.kvmanager.node import NO_WORKFLOW, Node

ROW_SUM_TOLERANCE = 1e-4
"""How far a forecast row's sum may be from 1 (float32 models round; more is a bug)."""
_CLEARLY_VALID = ROW_SUM_TOLERANCE / 2
"""Row sums this close to 1 are accepted without numpy (see :func:`_valid_rows`)."""
ENDED_MEMORY = 65_536
"""Terminated workflow ids a :class:`ScoreBoard` remembers, for late touches."""


def validate_forecast(forecast: np.ndarray, n_agents: int) -> np.ndarray:
    """Return ``forecast`` as float64 if it is a well-formed K-step forecast.

    Args:
        forecast: shape ``(K, n_agents + 1)``, ``K >= 1``; END is the last column; each
            row a probability distribution (see :mod:`pbkv.predictor.base`).
        n_agents: the number of agent columns.

    Raises:
        ValueError: the shape does not fit, or a value is not finite, negative, or a
            row does not sum to 1 (within :data:`ROW_SUM_TOLERANCE`); the message says which.
    """
    array = np.asarray(forecast, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] != n_agents + 1:
        raise ValueError(f"forecast shape {array.shape} does not fit {n_agents} agents + END")
    if not np.isfinite(array).all():
        raise ValueError("forecast holds values that are not finite")
    if (array < 0).any():
        raise ValueError(f"forecast holds negative probabilities (min {array.min():.3g})")
    sums = array.sum(axis=1)
    worst = int(np.abs(sums - 1.0).argmax())
    if abs(sums[worst] - 1.0) > ROW_SUM_TOLERANCE:
        raise ValueError(f"forecast row {worst} sums to {sums[worst]:.6g}; rows must sum to 1")
    return array


def agent_weights(
    forecast: np.ndarray, agents: Sequence[str], gamma: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Fold a K-step forecast into per-agent reuse weights.

    Plain Python over the rows (a forecast is a few rows of a few agents, where each
    numpy call costs more than the arithmetic); the sums run over ``k`` in order, as
    numpy's matmul does for ``K <= 3``, so the weights are bit-for-bit those of
    ``(gamma^(k-1) s^(k)) @ P`` there.

    Args:
        forecast: shape ``(K, len(agents) + 1)``; END is the last column.
        agents: the column names.
        gamma: confidence decay in (0, 1].

    Returns:
        ``(u, next_step)``: ``u[a] = sum_k gamma^(k-1) s^(k) P^(k)[a]`` (Eq. 2–4) and the
        step-1 distribution ``P^(1)[a]`` (the prefetch value of §5.4).

    Raises:
        ValueError: the forecast is malformed (see :func:`validate_forecast`).
    """
    rows = _valid_rows(forecast, len(agents))
    weights = []  # gamma^(k-1) s^(k), s^(k) the probability the workflow still runs at k
    alive = 1.0
    for k, row in enumerate(rows):
        weights.append(gamma**k * alive)
        alive *= 1.0 - row[-1]
    # zip(*rows) walks the columns (END last, left out by the strict zip with agents)
    u = [sum(map(mul, weights, column)) for column in zip(*rows, strict=True)]
    return dict(zip(agents, u[:-1], strict=True)), dict(zip(agents, rows[0][:-1], strict=True))


def _valid_rows(forecast: np.ndarray, n_agents: int) -> list[list[float]]:
    """Return ``forecast``'s rows as float lists if :func:`validate_forecast` accepts it.

    Checks well-formed forecasts in plain Python; anything not clearly valid (a row sum
    near the tolerance, a negative, a non-finite value, a wrong shape) goes through
    :func:`validate_forecast`, which accepts or raises exactly as before.
    """
    array = np.asarray(forecast, dtype=np.float64)
    if array.ndim == 2 and array.shape[0] >= 1 and array.shape[1] == n_agents + 1:
        rows: list[list[float]] = array.tolist()
        sums = list(map(sum, rows))
        # a NaN or an infinity makes the total non-finite, so it falls through as well
        if (
            isfinite(sum(sums))
            and min(map(min, rows)) >= 0.0
            and min(sums) >= 1.0 - _CLEARLY_VALID
            and max(sums) <= 1.0 + _CLEARLY_VALID
        ):
            return rows
    validated: list[list[float]] = validate_forecast(array, n_agents).tolist()
    return validated


class _ZeroIfMissing(dict[str, float]):
    """Per-agent weight changes; an agent the forecast does not name changes by 0."""

    def __missing__(self, agent: str) -> float:
        return 0.0


class ScoreBoard:
    """Per-workflow weights and per-node scores.

    Memory is bounded by the active workflows plus the ids of the last ``ended_memory``
    terminated ones (kept so that a late touch retires instead of reviving); a long-running
    server does not grow with the workflows it has served.

    Args:
        reprioritize: called with each node whose score or retired flag changed.
        gamma: confidence decay ``gamma``.
        ended_memory: terminated workflow ids remembered, >= 1.
    """

    def __init__(
        self,
        reprioritize: Callable[[Node], None],
        gamma: float,
        *,
        ended_memory: int = ENDED_MEMORY,
    ) -> None:
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        if ended_memory < 1:
            raise ValueError(f"ended_memory must be >= 1, got {ended_memory}")
        self.ended_memory = ended_memory
        self.gamma = gamma
        self._reprioritize = reprioritize
        self._weights: dict[str, dict[str, float]] = {}
        self._next: dict[str, dict[str, float]] = {}
        self._nodes: dict[str, set[Node]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._ordinal: dict[str, int] = {}  # active workflows only: bounded like _nodes
        self._ordinals = itertools.count()
        self.refreshed_nodes = 0

    def ordinal(self, workflow_id: str) -> int:
        """Return ``workflow_id``'s start ordinal (0 for the first workflow seen): its age.

        Ordinals only grow; a terminated workflow's is forgotten (a late caller gets a
        new, younger one)."""
        ordinal = self._ordinal.get(workflow_id)
        if ordinal is None:
            ordinal = self._ordinal[workflow_id] = next(self._ordinals)
        return ordinal

    @property
    def active_workflows(self) -> list[str]:
        return list(self._nodes)

    @property
    def ended_workflows(self) -> int:
        """Terminated workflow ids remembered (at most ``ended_memory``)."""
        return len(self._ended)

    def nodes_of(self, workflow_id: str) -> set[Node]:
        return self._nodes.get(workflow_id, set())

    def start(self, workflow_id: str) -> None:
        """Register an active workflow (no forecast yet: its weights are zero)."""
        self._ended.pop(workflow_id, None)
        self.ordinal(workflow_id)
        self._nodes.setdefault(workflow_id, set())
        self._weights.setdefault(workflow_id, {})
        self._next.setdefault(workflow_id, {})

    def touch(self, nodes: Iterable[Node], workflow_id: str, agent: str) -> None:
        """Record that ``agent`` of ``workflow_id`` used ``nodes`` (sets ``A_w(c)``).

        A workflow that has terminated is not brought back by a late request: what the
        late request used and no active workflow touched is retired, as it would have
        been had the request finished before the workflow did.

        Mutates: node accessors, scores, retired flags.
        """
        if workflow_id in self._ended:
            self._retire_unowned(nodes)
            return
        self.start(workflow_id)
        weight = self._weights[workflow_id].get(agent, 0.0)
        mine = self._nodes[workflow_id]
        age = self._ordinal[workflow_id]
        for node in nodes:
            agents = node.accessors.setdefault(workflow_id, set())
            if agent in agents:
                continue
            agents.add(agent)
            node.score += weight
            node.oldest = min(node.oldest, age)
            node.retired = False
            mine.add(node)
            self._reprioritize(node)

    def _retire_unowned(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            if not node.accessors and not node.retired:
                node.retired = True
                node.score = 0.0
                self._reprioritize(node)

    def set_forecast(self, workflow_id: str, forecast: np.ndarray, agents: Sequence[str]) -> int:
        """Apply a new K-step forecast for ``workflow_id`` to the nodes it touched.

        Returns:
            The number of nodes refreshed (0 for a terminated workflow).

        Raises:
            ValueError: the forecast is malformed (:func:`validate_forecast`); nothing
                changes.

        Mutates: scores of the workflow's nodes only.
        """
        new, next_step = agent_weights(forecast, agents, self.gamma)
        if workflow_id in self._ended:
            return 0  # a late forecast does not revive a terminated workflow
        if workflow_id not in self._weights:
            self.start(workflow_id)
        old = self._weights[workflow_id]
        self._weights[workflow_id] = new
        self._next[workflow_id] = next_step
        # u_new[a] - u_old[a] once per agent, not once per node and agent; a node's delta
        # sums them in its set's order, as the per-node sum always did
        change = _ZeroIfMissing(new)  # an agent the old weights lack changed by u_new - 0
        for agent, before in old.items():
            change[agent] = new.get(agent, 0.0) - before
        nodes = self._nodes[workflow_id]
        reprioritize = self._reprioritize
        for node in nodes:
            delta = sum(map(change.__getitem__, node.accessors[workflow_id]))
            if delta:
                node.score += delta
                reprioritize(node)
        self.refreshed_nodes += len(nodes)
        return len(nodes)

    def terminate(self, workflow_id: str) -> None:
        """Drop a finished workflow; nodes no active workflow touched become retired.

        Mutates: accessors, scores, retired flags of the workflow's nodes.
        """
        self._ended[workflow_id] = None
        self._ended.move_to_end(workflow_id)
        while len(self._ended) > self.ended_memory:
            self._ended.popitem(last=False)
        weights = self._weights.pop(workflow_id, {})
        self._next.pop(workflow_id, None)
        self._ordinal.pop(workflow_id, None)
        for node in self._nodes.pop(workflow_id, set()):
            agents = node.accessors.pop(workflow_id, set())
            node.score -= sum(weights.get(a, 0.0) for a in agents)
            node.oldest = min((self._ordinal[w] for w in node.accessors), default=NO_WORKFLOW)
            if not node.accessors:
                node.retired = True
                node.score = 0.0
            self._reprioritize(node)

    def next_step_value(self, node: Node) -> float:
        """Return ``sum_w A_w(c) . P_w^(1)``: the k=1 term of the score, for prefetch."""
        return sum(
            sum(self._next.get(w, {}).get(a, 0.0) for a in agents)
            for w, agents in node.accessors.items()
        )

    def on_split(self, node: Node, top: Node) -> None:
        """Tree hook: ``top`` was split off above ``node`` and inherits its accessors."""
        for w in top.accessors:
            self._nodes.setdefault(w, set()).add(top)

    def on_remove(self, node: Node) -> None:
        """Tree hook: ``node`` left the tree."""
        for w in node.accessors:
            self._nodes.get(w, set()).discard(node)
