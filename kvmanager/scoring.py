"""PBKV's predicted reuse score, kept current incrementally (paper Eq. 2–4, §5.3).

For node ``c``, active workflows ``W_act(c)`` that touched it, forecast rows ``P_w^(k)``
(conditional per step, see :mod:`pbkv.predictor.base`), access indicator ``A_w(c)``,
survival ``s_w^(k) = prod_{j<k} (1 - P_w^(j)[END])`` and decay ``gamma``::

    Score(c) = sum_{k=1..K} gamma^(k-1) sum_{w in W_act(c)} s_w^(k) (A_w(c) . P_w^(k))
             = sum_{w in W_act(c)} sum_{a in A_w(c)} u_w[a],
    u_w[a]   = sum_k gamma^(k-1) s_w^(k) P_w^(k)[a].

So a forecast for ``w`` changes only the nodes ``w`` touched, each by
``sum_{a in A_w(c)} (u_new[a] - u_old[a])``; that is the whole refresh. The weights come
from :mod:`pbkv.kvmanager.weights`; a time-aware policy scales each workflow's ``u_w`` by
when it is back (:meth:`ScoreBoard.set_time_weight`, :mod:`pbkv.kvmanager.timing`).
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import sub

import numpy as np

from pbkv.kvmanager.flows import (
    NO_FLOW,
    Flow,
    Move,
    ZeroIfMissing,
    join_group,
    leave_group,
    plan_groups,
)
from pbkv.kvmanager.node import NO_WORKFLOW, Node
from pbkv.kvmanager.weights import (
    ROW_SUM_TOLERANCE,
    TAIL_MAX_STEPS,
    agent_weights,
    beyond_horizon_mass,
    extend,
    fold,
    fold_default,
    history_sharpened,
    positions,
    valid_rows,
    validate_forecast,
)

__all__ = [  # the forecast's folding lives in pbkv.kvmanager.weights; these names stay here too
    "ROW_SUM_TOLERANCE",
    "TAIL_MAX_STEPS",
    "ScoreBoard",
    "agent_weights",
    "beyond_horizon_mass",
    "history_sharpened",
    "validate_forecast",
]

ENDED_MEMORY = 65_536
"""Terminated workflow ids a :class:`ScoreBoard` remembers, for late touches."""
CALL_SHARE_DECAY = 0.3
"""Weight of the latest call in a workflow's call shares (:meth:`ScoreBoard.note_invocation`)."""
MISS_RATE_DECAY = 0.02
"""Weight of the latest call in :attr:`ScoreBoard.miss_rate`'s moving average."""
EVIDENCE_CAP = 5.0
"""Largest ``|log(Q/P)|`` one call adds to the history's evidence (a call one expert gave
no mass would otherwise settle the question for ever)."""
HISTORY_WEIGHT_PRIOR = 0.1
"""The history's weight before any call is checked (odds 1:9 against it). Once the calls
favour the forecast more than that (log-odds below the prior's) the weight is 0 and the
score is Eq. 2 exactly (ties stay ties). Chosen against 0 and 0.01 at the paper's loads
(``docs/design.md``)."""
_POWERS = 8
"""``gamma**k`` a :class:`ScoreBoard` takes once, for ``k < _POWERS`` (horizons to 7 and
the tail past them)."""
PRIOR_EVIDENCE = math.log(HISTORY_WEIGHT_PRIOR / (1.0 - HISTORY_WEIGHT_PRIOR))
"""The prior's log-odds; forgotten evidence decays back to it."""


class ScoreBoard:
    """Per-workflow weights and per-node scores.

    Memory is bounded by the active workflows plus the ids of the last ``ended_memory``
    terminated ones (kept so that a late touch retires instead of reviving); a long-running
    server does not grow with the workflows it has served.

    A workflow's nodes are kept grouped by the agents of that workflow that touched them
    (``A_w(c)``), so a forecast computes each group's change once and then only adds it
    to the group's scores: most of a workflow's nodes share one agent set. While a
    workflow's forecasts name the same agents, each group's slots in the weight list
    are looked up once (:class:`Flow`'s plan), not once per forecast.

    Args:
        reprioritize: called with each node whose score or retired flag changed.
        gamma: confidence decay ``gamma``.
        ended_memory: terminated workflow ids remembered, >= 1.
        shift_groups: called once per forecast with its ``(delta, group)`` moves: add
            ``delta`` to the score of each node of ``group`` and re-key it, in one pass
            (:meth:`RadixTree.shift_scores`); default: the addition here, then
            ``reprioritize`` on each node.
        beyond_horizon: read each workflow's recent call shares: the score's tail past
            the horizon, weighted by :attr:`miss_rate`, and the history-sharpened rows
            within it, weighted by :meth:`history_weight` (see :func:`agent_weights`);
            ``False``: Eq. 2 as the paper writes it.
    """

    def __init__(
        self,
        reprioritize: Callable[[Node], None],
        gamma: float,
        *,
        ended_memory: int = ENDED_MEMORY,
        shift_groups: Callable[[list[Move]], None] | None = None,
        beyond_horizon: bool = True,
    ) -> None:
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self._powers = tuple(gamma**k for k in range(_POWERS))  # gamma**k, taken once
        if ended_memory < 1:
            raise ValueError(f"ended_memory must be >= 1, got {ended_memory}")
        self.ended_memory = ended_memory
        self._gamma = gamma
        self.beyond_horizon = beyond_horizon
        self.miss_rate = 1.0
        """Moving average of ``1 - P^(1)[agent]`` over the calls a step-1 forecast named
        beforehand: how much the forecasts miss (1 until checked)."""
        self.history_evidence = PRIOR_EVIDENCE
        """Log-odds that the history-sharpened rows predict calls better than the
        forecast, over every checked call (forgotten at :data:`MISS_RATE_DECAY`); a new
        workflow starts from it (:meth:`note_invocation`)."""
        self._history_evidence: dict[str, float] = {}  # active workflows only
        self._call_shares: dict[str, dict[str, float]] = {}  # active workflows only
        self._reprioritize = reprioritize
        self._shift_groups = shift_groups or self._shift_each
        self._flows: dict[str, Flow] = {}  # active workflows only
        self._nodes: dict[str, set[Node]] = {}
        # workflow -> its agents that touched a node -> those nodes (partitions _nodes)
        self._groups: dict[str, dict[frozenset[str], set[Node]]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._ordinal: dict[str, int] = {}  # active workflows only: bounded like _nodes
        # active workflow -> agent -> the deepest node its latest request touched
        self._leaves: dict[str, dict[str, Node]] = {}
        self._ordinals = itertools.count()
        self.ordinals_version = 0
        """Bumped whenever an ordinal is given or forgotten: while it stays put,
        :meth:`ordinal` returns what it returned before and changes nothing."""
        self.workflows_version = 0
        """Bumped whenever a workflow joins or leaves :attr:`active_workflows`: while it
        stays put, that list is what it was."""
        self.refreshed_nodes = 0

    @property
    def gamma(self) -> float:
        """The confidence decay ``gamma``, fixed at construction (its powers are taken
        once)."""
        return self._gamma

    def _shift_each(self, moves: list[Move]) -> None:
        for delta, group in moves:
            for node in group:
                node.score += delta
                self._reprioritize(node)

    def ordinal(self, workflow_id: str) -> int:
        """Return ``workflow_id``'s start ordinal (0 for the first workflow seen): its age.

        Ordinals only grow; a terminated workflow's is forgotten (a late caller gets a
        new, younger one)."""
        ordinal = self._ordinal.get(workflow_id)
        if ordinal is None:
            ordinal = self._ordinal[workflow_id] = next(self._ordinals)
            self.ordinals_version += 1
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
        if workflow_id not in self._nodes:
            self._nodes[workflow_id] = set()
            self.workflows_version += 1
        self._groups.setdefault(workflow_id, {})
        if workflow_id not in self._flows:
            self._flows[workflow_id] = Flow()

    def note_invocation(self, workflow_id: str, agent: str) -> None:
        """Note that ``workflow_id`` calls ``agent``: check the step-1 forecast made before
        the call (:attr:`miss_rate`) and count the call in the workflow's recent call
        shares, a moving average of one-hot calls (the latest weighs
        :data:`CALL_SHARE_DECAY`, the first 1), which the next forecast's tail reads.
        """
        if workflow_id in self._ended:
            return
        flow = self._flows.get(workflow_id)
        predicted = flow.predicted() if flow is not None else None
        shares = self._call_shares.get(workflow_id)
        if predicted:
            miss = 1.0 - min(1.0, max(0.0, predicted.get(agent, 0.0)))
            self.miss_rate += MISS_RATE_DECAY * (miss - self.miss_rate)
            if shares and self.beyond_horizon:
                self._weigh_history(workflow_id, agent, predicted, shares)
        if shares is None:
            self._call_shares[workflow_id] = {agent: 1.0}
            return
        for name in shares:
            shares[name] *= 1.0 - CALL_SHARE_DECAY
        shares[agent] = shares.get(agent, 0.0) + CALL_SHARE_DECAY

    def _weigh_history(
        self,
        workflow_id: str,
        agent: str,
        predicted: Mapping[str, float],
        shares: Mapping[str, float],
    ) -> None:
        """Add the call's ``log(Q[agent] / P[agent])`` to the history's evidence.

        ``P`` is the step-1 forecast made before the call, ``Q`` its history-sharpened
        row (:func:`history_sharpened`, from the call shares that forecast read). Both
        the workflow's evidence (starting from the board's) and the board's are
        forgotten toward the prior at :data:`MISS_RATE_DECAY` per call.
        """
        if agent not in predicted:
            return
        names = list(predicted)
        q = history_sharpened([predicted[a] for a in names], names, shares)[names.index(agent)]
        p = predicted[agent]
        ratio = _log_ratio(q, p)
        own = self._history_evidence.get(workflow_id, self.history_evidence)
        self._history_evidence[workflow_id] = _add_evidence(own, ratio)
        self.history_evidence = _add_evidence(self.history_evidence, ratio)

    def history_weight(self, workflow_id: str) -> float:
        """Return the mixture weight ``m`` of the history-sharpened rows for a workflow:
        the posterior probability ``1 / (1 + exp(-L))`` of its log-odds ``L``; 0 while
        ``L`` is below the prior's (:data:`HISTORY_WEIGHT_PRIOR`)."""
        evidence = self._history_evidence.get(workflow_id, self.history_evidence)
        if evidence < PRIOR_EVIDENCE:
            return 0.0
        return 1.0 / (1.0 + math.exp(-evidence))

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
        flow = self._flows[workflow_id]
        weight = flow.weight(agent)
        mine = self._nodes[workflow_id]
        groups = self._groups[workflow_id]
        age = self._ordinal[workflow_id]
        last = None
        for node in nodes:
            last = node
            agents = node.accessors.get(workflow_id)
            if agents is None:
                agents = node.accessors[workflow_id] = set()
            elif agent in agents:
                continue
            elif leave_group(groups, frozenset(agents), node):
                flow.plan = None
            agents.add(agent)
            if join_group(groups, frozenset(agents), node):
                flow.plan = None
            node.score += weight
            node.oldest = min(node.oldest, age)
            node.retired = False
            mine.add(node)
            self._reprioritize(node)
        if last is not None:
            self._leaves.setdefault(workflow_id, {})[agent] = last

    def leave_branch(self, workflow_id: str, agent: str, path: Sequence[Node]) -> int:
        """Note that ``agent`` of ``workflow_id`` starts a request whose cached prefix is
        ``path`` (root side first): the nodes of its previous request's branch that
        ``path`` does not hold are no longer its context, so ``agent`` leaves their
        ``A_w(c)``; a node no active workflow holds then is retired.

        A prompt that extends the previous one (an append-only conversation) holds its
        whole branch and changes nothing; a prompt rewritten above its tail (a re-planner
        rewriting its plan at the top) leaves the old tail dead, and without this the
        score would keep protecting it as long as the agent keeps running (issue 28).

        Returns:
            Nodes ``agent`` left.

        Mutates: accessors, scores, groups, retired flags of the left nodes.
        """
        leaf = self._leaves.get(workflow_id, {}).get(agent)
        if leaf is None or workflow_id in self._ended:
            return 0
        held = set(path)
        if leaf in held:
            return 0
        left = 0
        node: Node | None = leaf
        while node is not None and node.parent is not None and node not in held:
            left += self._leave_node(node, workflow_id, agent)
            node = node.parent
        return left

    def _leave_node(self, node: Node, workflow_id: str, agent: str) -> int:
        agents = node.accessors.get(workflow_id)
        if not agents or agent not in agents or node not in self._nodes[workflow_id]:
            return 0  # not its context, or the node left the tree (on_remove)
        flow = self._flows[workflow_id]
        groups = self._groups[workflow_id]
        if leave_group(groups, frozenset(agents), node):
            flow.plan = None
        agents.discard(agent)
        node.score -= flow.weight(agent)
        if agents:
            if join_group(groups, frozenset(agents), node):
                flow.plan = None
        else:
            del node.accessors[workflow_id]
            self._nodes[workflow_id].discard(node)
            node.oldest = min((self._ordinal[w] for w in node.accessors), default=NO_WORKFLOW)
            if not node.accessors:
                node.retired = True
                node.score = 0.0
        self._reprioritize(node)
        return 1

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
            ValueError: the forecast is malformed (:func:`validate_forecast`) or
                ``agents`` names an agent twice; nothing changes.

        Mutates: scores of the workflow's nodes only.
        """
        if type(agents) is not tuple:
            agents = tuple(agents)
        flow = self._flows.get(workflow_id)
        same = flow is not None and agents == flow.agents
        position = flow.position if same else positions(agents)  # type: ignore[union-attr]
        shares = self._call_shares.get(workflow_id) if self.beyond_horizon else None
        mix = self.history_weight(workflow_id) if shares else 0.0
        folded = fold_default(forecast, len(agents), self._powers)
        if folded is None:
            rows = valid_rows(forecast, len(agents))
            new = fold(
                rows, forecast, agents, position, self._gamma, self._powers, shares,
                self.miss_rate, mix,
            )  # fmt: skip
        else:
            rows, new = folded
            if shares:
                extend(
                    new, rows, agents, position, self._gamma, self._powers, shares,
                    self.miss_rate, mix,
                )  # fmt: skip
        if flow is None:  # a workflow with a flow is active: terminate() drops it
            if workflow_id in self._ended:
                return 0  # a late forecast does not revive a terminated workflow
            self.start(workflow_id)
            flow = self._flows[workflow_id]
        flow.raw = new
        if flow.scale != 1.0:
            new = [u * flow.scale for u in new]
        if same:
            moves = self._moves(flow, new, self._groups[workflow_id])
        else:
            moves = self._moves_renamed(flow, agents, new, self._groups[workflow_id])
            flow.agents, flow.position, flow.plan = agents, position, None
        flow.weights = new
        flow.first = rows[0]
        if moves:
            self._shift_groups(moves)
        refreshed = len(self._nodes[workflow_id])
        self.refreshed_nodes += refreshed
        return refreshed

    def set_time_weight(self, workflow_id: str, weight: float) -> int:
        """Scale ``workflow_id``'s share of its nodes' scores by ``weight`` (its time
        factor ``f_w``, :mod:`pbkv.kvmanager.timing`): ``u[a]`` becomes ``weight`` times
        the forecast's, now and for its later forecasts, until set again.

        Returns:
            Nodes refreshed (0 for a workflow the board does not hold).

        Raises:
            ValueError: ``weight`` is not in (0, 1].

        Mutates: scores of the workflow's nodes only.
        """
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"time weight must be in (0, 1], got {weight}")
        flow = self._flows.get(workflow_id)
        if flow is None or weight == flow.scale:
            return 0
        new = [u * weight for u in flow.raw] if weight != 1.0 else list(flow.raw)
        moves = self._moves(flow, new, self._groups[workflow_id])
        flow.weights, flow.scale = new, weight
        if moves:
            self._shift_groups(moves)
        refreshed = len(self._nodes[workflow_id])
        self.refreshed_nodes += refreshed
        return refreshed

    @staticmethod
    def _moves(flow: Flow, new: list[float], groups: dict[frozenset[str], set[Node]]) -> list[Move]:
        """Return each group's change ``sum_{a in A_w(c)} (u_new[a] - u_old[a])`` with
        the group, where it is not 0; ``new`` and ``flow.weights`` in the same
        ``agents``' order.

        ``u_new[a] - u_old[a]`` is taken once per agent, not once per node and agent; a
        group's change sums them in its set's order (then the 0 slot's ``0.0 - 0.0``:
        ``x + 0.0 == x`` but for the sign of a zero, and a zero change moves nothing), as
        the per-node sum always did.
        """
        change = list(map(sub, new, flow.weights))  # after - before, per slot
        plan = flow.plan
        if plan is None:
            plan = flow.plan = plan_groups(flow, groups)
        moves = []
        for slots, group in plan:
            delta = sum(slots(change))
            if delta:
                moves.append((delta, group))
        return moves

    @staticmethod
    def _moves_renamed(
        flow: Flow,
        agents: tuple[str, ...],
        new: list[float],
        groups: dict[frozenset[str], set[Node]],
    ) -> list[Move]:
        """:meth:`_moves` for a forecast whose ``agents`` differ from the last one's (or
        the first), by agent name: an agent only the new forecast names changes by
        ``u_new``, one only the old names by ``0 - u_old``, one neither names by 0."""
        after = dict(zip(agents, new))  # noqa: B905 (the 0 slot left out)
        change = ZeroIfMissing(after)
        for agent, before in zip(flow.agents, flow.weights):  # noqa: B905
            change[agent] = after.get(agent, 0.0) - before
        changed = change.__getitem__
        moves = []
        for agents_used, group in groups.items():
            delta = sum(map(changed, agents_used))
            if delta:
                moves.append((delta, group))
        return moves

    def terminate(self, workflow_id: str) -> None:
        """Drop a finished workflow; nodes no active workflow touched become retired.

        Mutates: accessors, scores, retired flags of the workflow's nodes.
        """
        self._ended[workflow_id] = None
        self._ended.move_to_end(workflow_id)
        while len(self._ended) > self.ended_memory:
            self._ended.popitem(last=False)
        flow = self._flows.pop(workflow_id, None) or Flow()
        self._call_shares.pop(workflow_id, None)
        self._history_evidence.pop(workflow_id, None)
        self._groups.pop(workflow_id, None)
        self._leaves.pop(workflow_id, None)
        if self._ordinal.pop(workflow_id, None) is not None:
            self.ordinals_version += 1
        if workflow_id in self._nodes:
            self.workflows_version += 1
        for node in self._nodes.pop(workflow_id, set()):
            agents = node.accessors.pop(workflow_id, set())
            node.score -= sum(flow.weight(a) for a in agents)
            node.oldest = min((self._ordinal[w] for w in node.accessors), default=NO_WORKFLOW)
            if not node.accessors:
                node.retired = True
                node.score = 0.0
            self._reprioritize(node)

    def check_integrity(self) -> None:
        """Assert that each workflow's groups partition its nodes by ``A_w(c)``, and that
        a workflow's plan (:class:`Flow`), where it has one, is that of its groups.

        Raises:
            AssertionError: a node is missing from its group, sits in another group, or
                a group is empty, or the plan holds other groups or slots; the message
                names the workflow and the counts.
        """
        for workflow_id, nodes in self._nodes.items():
            groups = self._groups.get(workflow_id, {})
            grouped = sum(len(g) for g in groups.values())
            members = set().union(*groups.values())
            if grouped != len(nodes) or members != nodes:
                raise AssertionError(
                    f"workflow {workflow_id}: {len(nodes)} nodes but {grouped} in groups "
                    f"({len(members ^ nodes)} differ)"
                )
            for agents, group in groups.items():
                wrong = [n for n in group if frozenset(n.accessors.get(workflow_id, ())) != agents]
                if wrong or not group:
                    raise AssertionError(
                        f"workflow {workflow_id}: group {sorted(agents)} holds "
                        f"{len(wrong)} of {len(group)} nodes with other agents"
                    )
            self._checkplan_groups(workflow_id, groups)

    def _checkplan_groups(self, workflow_id: str, groups: dict[frozenset[str], set[Node]]) -> None:
        flow = self._flows.get(workflow_id)
        if flow is None or flow.plan is None:
            return
        slots = [float(i) for i in range(len(flow.agents) + 1)]  # each slot reads its index
        planned = [(getter(slots), id(group)) for getter, group in flow.plan]
        expected = [(getter(slots), id(group)) for getter, group in plan_groups(flow, groups)]
        if planned != expected:
            raise AssertionError(
                f"workflow {workflow_id}: a plan of {len(planned)} groups where "
                f"{len(expected)} are due ({len(set(planned) ^ set(expected))} differ)"
            )

    def next_step_value(self, node: Node) -> float:
        """Return ``sum_w A_w(c) . P_w^(1)``: the k=1 term of the score, for prefetch."""
        flows = self._flows
        return sum(
            sum((flows.get(w) or NO_FLOW).next_step(a) for a in agents)
            for w, agents in node.accessors.items()
        )

    def on_split(self, node: Node, top: Node) -> None:
        """Tree hook: ``top`` was split off above ``node`` and inherits its accessors."""
        for w, agents in top.accessors.items():
            if w not in self._nodes:
                self.workflows_version += 1
            self._nodes.setdefault(w, set()).add(top)
            if join_group(self._groups.setdefault(w, {}), frozenset(agents), top):
                self._forgetplan_groups(w)

    def on_remove(self, node: Node) -> None:
        """Tree hook: ``node`` left the tree."""
        for w, agents in node.accessors.items():
            self._nodes.get(w, set()).discard(node)
            groups = self._groups.get(w)
            if groups is not None and leave_group(groups, frozenset(agents), node):
                self._forgetplan_groups(w)

    def _forgetplan_groups(self, workflow_id: str) -> None:
        flow = self._flows.get(workflow_id)
        if flow is not None:
            flow.plan = None


def _add_evidence(evidence: float, ratio: float) -> float:
    """Return log-odds ``evidence`` after one call's ``ratio``, the older evidence
    forgotten toward :data:`PRIOR_EVIDENCE` at :data:`MISS_RATE_DECAY`."""
    return PRIOR_EVIDENCE + (1.0 - MISS_RATE_DECAY) * (evidence - PRIOR_EVIDENCE) + ratio


def _log_ratio(q: float, p: float) -> float:
    """Return ``log(q / p)`` clipped to ``[-EVIDENCE_CAP, EVIDENCE_CAP]`` (0 if both are 0)."""
    if q <= 0.0 and p <= 0.0:
        return 0.0
    if q <= 0.0 or p <= 0.0:
        return EVIDENCE_CAP if p <= 0.0 else -EVIDENCE_CAP
    return min(EVIDENCE_CAP, max(-EVIDENCE_CAP, math.log(q / p)))
