"""A workflow's forecast state on the score board, and its nodes grouped by agent set.

A :class:`~pbkv.kvmanager.scoring.ScoreBoard` keeps, per active workflow, a :class:`Flow`
(the last forecast's columns and weights) and its nodes grouped by the agents of that
workflow that touched them (``A_w(c)``): a forecast computes each group's change once and
adds it to the group's scores (:func:`plan_groups`).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter

from pbkv.kvmanager.node import Node


class ZeroIfMissing(dict[str, float]):
    """Per-agent weight changes; an agent the forecast does not name changes by 0."""

    def __missing__(self, agent: str) -> float:
        return 0.0


class Flow:
    """One active workflow's forecast state (:class:`ScoreBoard`).

    Attributes:
        agents: the columns of its last forecast (``()`` before the first).
        position: each of ``agents``' column.
        weights: ``u[a]`` in ``agents``' order, then ``0.0``: an agent the forecast does
            not name weighs ``weights[position.get(a, -1)]``, 0.
        first: the last forecast's step-1 row ``P^(1)`` (END last); ``None`` before one.
        plan: per agent-set group, the ``weights`` slots of its agents (then the 0 slot)
            and its nodes: a forecast under the same ``agents`` sums each group's change
            from them; ``None`` when a group came or went or ``agents`` changed.
        scale: the time factor ``f_w`` (:meth:`ScoreBoard.set_time_weight`): ``weights``
            are ``raw`` times it.
        raw: ``u[a]`` as the forecast gives them (``weights`` before the time factor).
    """

    __slots__ = ("agents", "position", "weights", "first", "plan", "scale", "raw")

    def __init__(self) -> None:
        self.agents: tuple[str, ...] = ()
        self.position: dict[str, int] = {}
        self.weights: list[float] = [0.0]
        self.first: list[float] | None = None
        self.plan: list[tuple[Callable[[list[float]], tuple[float, ...]], set[Node]]] | None = None
        self.scale = 1.0
        self.raw: list[float] = self.weights

    def weight(self, agent: str) -> float:
        """Return ``u[agent]`` (0 for an agent the last forecast does not name)."""
        return self.weights[self.position.get(agent, -1)]

    def next_step(self, agent: str) -> float:
        """Return ``P^(1)[agent]`` of the last forecast times the time factor (0 before
        one, or if unnamed)."""
        i = self.position.get(agent)
        return 0.0 if i is None or self.first is None else self.first[i] * self.scale

    def predicted(self) -> dict[str, float]:
        """Return the last forecast's ``P^(1)`` per agent (empty before one)."""
        return {} if self.first is None else dict(zip(self.agents, self.first))  # noqa: B905


Move = tuple[float, set[Node]]
"""A forecast's score change for one agent-set group, and the group."""

NO_FLOW = Flow()
"""The state of a workflow the board does not hold (read only)."""


def leave_group(
    groups: dict[frozenset[str], set[Node]], agents: frozenset[str], node: Node
) -> bool:
    """Take ``node`` out of its agent-set group; return whether that dropped the group
    (it was left empty)."""
    group = groups.get(agents)
    if group is not None:
        group.discard(node)
        if not group:
            del groups[agents]
            return True
    return False


def join_group(groups: dict[frozenset[str], set[Node]], agents: frozenset[str], node: Node) -> bool:
    """Put ``node`` in its agent-set group; return whether that made the group."""
    group = groups.get(agents)
    if group is None:
        groups[agents] = {node}
        return True
    group.add(node)
    return False


def plan_groups(
    flow: Flow, groups: dict[frozenset[str], set[Node]]
) -> list[tuple[Callable[[list[float]], tuple[float, ...]], set[Node]]]:
    """Return :class:`Flow`'s plan for ``groups``: per group, a getter of its agents'
    slots of a list in ``flow.agents``' order (in the group's set order; an agent
    ``flow.agents`` does not name reads the 0 slot), then the 0 slot, and the group."""
    zero = len(flow.agents)
    position = flow.position
    return [
        (itemgetter(*[position.get(a, zero) for a in agents], zero), group)
        for agents, group in groups.items()
    ]
