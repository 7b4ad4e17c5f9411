"""An online first-order-Markov survival eviction with next-agent warm-up (§5.2).

The ``markov-survival`` baseline, in the style of CacheSage (arXiv 2605.27744) and
CacheScout (arXiv 2608.14624): an agent-transition model learned online from the
invocations the KV manager sees (no offline training), and an eviction order by how
likely a cached node is to be used again before its workflows end.

Model: a first-order Markov chain over agents and ``END``, counted from consecutive
invocations of each workflow (a terminated workflow counts its last agent ``-> END``),
with add-``alpha`` smoothing over the agents seen so far and ``END``, so an agent's row
is ``(n[a][b] + alpha) / (n[a] + alpha * (|V| + 1))``. One model serves every
workflow of the runtime (agent names are the states).

Eviction key: for a node ``c`` and an active workflow ``w`` that touched it with agents
``A_w(c)``, ``h_w(c)`` is the probability that ``w``, from the agent it runs now,
*survives* (does not reach ``END``) to invoke an agent of ``A_w(c)``: the absorption
probability of the chain into ``A_w(c)`` before ``END``,

    h(x) = sum_{b in A} P(x, b) + sum_{b not in A} P(x, b) h(b),

solved exactly (``|V|`` equations). The node's value is the probability that *some*
workflow holding it does, ``1 - prod_w (1 - h_w(c))``; nodes are evicted in ascending
value (retired nodes, held by no active workflow, have value 0 and go first), least
recently used first among equals. A node is re-valued when a workflow holding it
advances or ends, and when a request over it ends (before it becomes evictable), with
the model as it stands then.

Warm-up: in pure-decode steps, host-resident nodes of each workflow's most likely next
agent (``argmax_b P(a_w, b)``, ``END`` aside) are loaded into free and retired GPU room
within the step's idle bandwidth, best ``P`` first: pbkv's conservative prefetch (§5.4)
with this value (:class:`WarmupPrefetcher`).

Plain synchronous code (no trio), driven by :class:`~pbkv.kvmanager.KVManager`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from pbkv.kvmanager.node import Node
from pbkv.kvmanager.prefetch import Prefetcher
from pbkv.kvmanager.scoring import ScoreBoard

if TYPE_CHECKING:
    from pbkv.kvmanager.manager import Admission

END = "END"
"""The chain's absorbing state: the workflow terminated."""

DEFAULT_SMOOTHING = 1.0
"""``alpha`` of the add-alpha smoothing (Laplace): an agent seen once still has
every transition possible."""


class MarkovChain:
    """An online first-order Markov chain over agents and :data:`END`.

    Args:
        smoothing: ``alpha`` > 0 added to every transition count.

    Raises:
        ValueError: ``smoothing <= 0``.
    """

    def __init__(self, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if smoothing <= 0.0:
            raise ValueError(f"smoothing must be > 0, got {smoothing}")
        self.smoothing = smoothing
        self.agents: list[str] = []
        self._index: dict[str, int] = {}
        self._counts = np.zeros((0, 1))  # rows: from agent; columns: to agent, then END
        self.version = 0
        self._matrix: np.ndarray | None = None  # rows of P at this version
        self._reach: dict[frozenset[str], np.ndarray] = {}  # absorption at this version

    def ensure(self, agent: str) -> int:
        """Return ``agent``'s state index, adding the state on first sight."""
        i = self._index.get(agent)
        if i is None:
            i = self._index[agent] = len(self.agents)
            self.agents.append(agent)
            n = len(self.agents)
            counts = np.zeros((n, n + 1))
            counts[: n - 1, : n - 1] = self._counts[:, :-1]
            counts[: n - 1, -1] = self._counts[:, -1]
            self._counts = counts
            self._changed()
        return i

    def observe(self, prev: str, nxt: str) -> None:
        """Count one transition ``prev -> nxt`` (``nxt`` may be :data:`END`)."""
        i = self.ensure(prev)
        j = len(self.agents) if nxt == END else self.ensure(nxt)
        self._counts[i, j] += 1.0
        self._changed()

    def matrix(self) -> np.ndarray:
        """Return ``P``, shape ``(|V|, |V| + 1)``: row ``a`` is ``P(a -> .)``, the last
        column ``END``. Does not modify the counts."""
        if self._matrix is None:
            smoothed = self._counts + self.smoothing
            self._matrix = smoothed / smoothed.sum(axis=1, keepdims=True)
        return self._matrix

    def row(self, agent: str | None) -> np.ndarray:
        """Return ``P(agent -> .)`` (uniform for an unknown or ``None`` agent)."""
        i = self._index.get(agent) if agent is not None else None
        if i is None:
            n = len(self.agents) + 1
            return np.full(n, 1.0 / n)
        return self.matrix()[i]

    def reach(self, agent: str | None, targets: frozenset[str]) -> float:
        """Return the probability that a workflow that just ran ``agent`` invokes an
        agent of ``targets`` before :data:`END` (absorption probability).

        Shapes: solves ``|V|`` linear equations once per ``targets`` and model version.
        """
        absorbed = self._reach.get(targets)
        if absorbed is None:
            absorbed = self._reach[targets] = self._absorb(targets)
        row = self.row(agent)
        return float(min(1.0, max(0.0, row[:-1] @ absorbed)))

    def most_likely_next(self, agent: str | None) -> tuple[str, float]:
        """Return the agent ``agent`` most likely calls next and that probability
        (:data:`END` aside; the first seen on ties; ``("", 0.0)`` with no agent known)."""
        if not self.agents:
            return "", 0.0
        row = self.row(agent)[:-1]
        j = int(np.argmax(row))
        return self.agents[j], float(row[j])

    def _absorb(self, targets: frozenset[str]) -> np.ndarray:
        """Return, per agent ``b``, ``1`` for a target, else ``h(b)``: the probability of
        reaching a target before END *from* ``b`` (after it runs)."""
        p = self.matrix()
        n = len(self.agents)
        hit = np.array([a in targets for a in self.agents], dtype=bool)
        q = p[:, :n] * ~hit  # transitions to non-targets
        r = p[:, :n][:, hit].sum(axis=1)  # one step into a target
        h = np.linalg.solve(np.eye(n) - q, r)
        return np.where(hit, 1.0, h)

    def _changed(self) -> None:
        self.version += 1
        self._matrix = None
        self._reach = {}


class SurvivalTracker:
    """Keep each node's survival value in ``node.hint`` (see the module docstring).

    Args:
        scores: the score board (``A_w(c)`` in ``node.accessors``, each workflow's nodes).
        reprioritize: called with each node whose ``hint`` changed.
        smoothing: the chain's add-alpha smoothing.
    """

    def __init__(
        self,
        scores: ScoreBoard,
        reprioritize: Callable[[Node], None],
        smoothing: float = DEFAULT_SMOOTHING,
    ) -> None:
        self.chain = MarkovChain(smoothing)
        self._scores = scores
        self._reprioritize = reprioritize
        self._current: dict[str, str] = {}  # workflow -> the agent it runs now

    def current(self, workflow_id: str) -> str | None:
        """Return the agent ``workflow_id`` invoked last (``None``: none seen)."""
        return self._current.get(workflow_id)

    def on_agent_invoked(self, workflow_id: str, agent: str) -> None:
        """Count the transition and re-value the workflow's nodes.

        Mutates: the chain, ``hint`` and eviction order of ``workflow_id``'s nodes.
        """
        prev = self._current.get(workflow_id)
        if prev is None:
            self.chain.ensure(agent)
        else:
            self.chain.observe(prev, agent)
        self._current[workflow_id] = agent
        self.refresh(self._scores.nodes_of(workflow_id))

    def on_terminated(self, workflow_id: str) -> None:
        """Count ``-> END`` and re-value the workflow's nodes without it.

        Call before the score board forgets the workflow's nodes.

        Mutates: the chain, ``hint`` and eviction order of ``workflow_id``'s nodes.
        """
        prev = self._current.pop(workflow_id, None)
        if prev is not None:
            self.chain.observe(prev, END)
        self.refresh(self._scores.nodes_of(workflow_id), ended=workflow_id)

    def on_released(self, admission: Admission) -> None:
        """Re-value the nodes a finished request leased (before they become evictable)."""
        node: Node | None = admission.lease.node
        path = []
        while node is not None and not node.is_root:
            path.append(node)
            node = node.parent
        self.refresh(path)

    def value(self, node: Node, ended: str | None = None) -> float:
        """Return ``1 - prod_w (1 - h_w(node))`` over the active workflows holding
        ``node`` (``ended`` left out). Does not modify anything."""
        miss = 1.0
        for w, agents in node.accessors.items():
            if w != ended and agents:
                miss *= 1.0 - self.chain.reach(self._current.get(w), frozenset(agents))
        return 1.0 - miss

    def next_step_value(self, node: Node) -> float:
        """Return the warm-up value of ``node``: the highest probability with which a
        workflow holding it calls next an agent of its ``A_w``, among workflows whose
        most likely next agent is such an agent (0 when none is)."""
        best = 0.0
        for w, agents in node.accessors.items():
            agent, p = self.chain.most_likely_next(self._current.get(w))
            if agent in agents and p > best:
                best = p
        return best

    def refresh(self, nodes: Iterable[Node], ended: str | None = None) -> None:
        """Re-value ``nodes`` (``ended`` left out). Mutates ``hint`` and eviction order."""
        for node in nodes:
            hint = _rounded(self.value(node, ended))
            if hint != node.hint:
                node.hint = hint
                self._reprioritize(node)


def _rounded(value: float) -> float:
    """Round to 12 digits, so equal true values tie (and LRU decides)."""
    return round(value, 12) if math.isfinite(value) else 0.0


class WarmupPrefetcher(Prefetcher):
    """Conservative prefetch (§5.4) valued by the survival tracker's next-agent warm-up.

    Args:
        tracker: the survival tracker.
        *args / **kwargs: as :class:`~pbkv.kvmanager.prefetch.Prefetcher`.
    """

    def __init__(self, tracker: SurvivalTracker, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tracker = tracker

    def _value(self, node: Node) -> float:
        return self.tracker.next_step_value(node)
