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

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from pbkv.kvmanager.node import NO_WORKFLOW, Node


def agent_weights(
    forecast: np.ndarray, agents: Sequence[str], gamma: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Fold a K-step forecast into per-agent reuse weights.

    Args:
        forecast: shape ``(K, len(agents) + 1)``; END is the last column.
        agents: the column names.
        gamma: confidence decay in (0, 1].

    Returns:
        ``(u, next_step)``: ``u[a] = sum_k gamma^(k-1) s^(k) P^(k)[a]`` (Eq. 2–4) and the
        step-1 distribution ``P^(1)[a]`` (the prefetch value of §5.4).

    Raises:
        ValueError: the forecast's shape does not match ``agents``.
    """
    if forecast.ndim != 2 or forecast.shape[1] != len(agents) + 1:
        raise ValueError(f"forecast shape {forecast.shape} does not fit {len(agents)} agents + END")
    alive = np.concatenate(([1.0], np.cumprod(1.0 - forecast[:-1, -1])))
    decay = gamma ** np.arange(forecast.shape[0])
    u = (decay * alive) @ forecast[:, :-1]
    return dict(zip(agents, u.tolist(), strict=True)), dict(
        zip(agents, forecast[0, :-1].tolist(), strict=True)
    )


class ScoreBoard:
    """Per-workflow weights and per-node scores.

    Args:
        reprioritize: called with each node whose score or retired flag changed.
        gamma: confidence decay ``gamma``.
    """

    def __init__(self, reprioritize: Callable[[Node], None], gamma: float) -> None:
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self.gamma = gamma
        self._reprioritize = reprioritize
        self._weights: dict[str, dict[str, float]] = {}
        self._next: dict[str, dict[str, float]] = {}
        self._nodes: dict[str, set[Node]] = {}
        self._ended: set[str] = set()
        self._ordinal: dict[str, int] = {}
        self.refreshed_nodes = 0

    def ordinal(self, workflow_id: str) -> int:
        """Return ``workflow_id``'s start ordinal (0 for the first workflow seen): its age."""
        return self._ordinal.setdefault(workflow_id, len(self._ordinal))

    @property
    def active_workflows(self) -> list[str]:
        return list(self._nodes)

    def nodes_of(self, workflow_id: str) -> set[Node]:
        return self._nodes.get(workflow_id, set())

    def start(self, workflow_id: str) -> None:
        """Register an active workflow (no forecast yet: its weights are zero)."""
        self._ended.discard(workflow_id)
        self.ordinal(workflow_id)
        self._nodes.setdefault(workflow_id, set())
        self._weights.setdefault(workflow_id, {})
        self._next.setdefault(workflow_id, {})

    def touch(self, nodes: Iterable[Node], workflow_id: str, agent: str) -> None:
        """Record that ``agent`` of ``workflow_id`` used ``nodes`` (sets ``A_w(c)``).

        A workflow that has terminated is not brought back by a late request.

        Mutates: node accessors, scores, retired flags.
        """
        if workflow_id in self._ended:
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

    def set_forecast(self, workflow_id: str, forecast: np.ndarray, agents: Sequence[str]) -> int:
        """Apply a new K-step forecast for ``workflow_id`` to the nodes it touched.

        Returns:
            The number of nodes refreshed.

        Mutates: scores of the workflow's nodes only.
        """
        self.start(workflow_id)
        new, next_step = agent_weights(forecast, agents, self.gamma)
        old = self._weights[workflow_id]
        self._weights[workflow_id] = new
        self._next[workflow_id] = next_step
        nodes = self._nodes[workflow_id]
        for node in nodes:
            delta = sum(new.get(a, 0.0) - old.get(a, 0.0) for a in node.accessors[workflow_id])
            if delta:
                node.score += delta
                self._reprioritize(node)
        self.refreshed_nodes += len(nodes)
        return len(nodes)

    def terminate(self, workflow_id: str) -> None:
        """Drop a finished workflow; nodes no active workflow touched become retired.

        Mutates: accessors, scores, retired flags of the workflow's nodes.
        """
        self._ended.add(workflow_id)
        weights = self._weights.pop(workflow_id, {})
        self._next.pop(workflow_id, None)
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
