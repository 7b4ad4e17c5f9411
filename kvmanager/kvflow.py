"""KVFlow's baseline policy state: steps-to-execution over a static agent step graph.

KVFlow (Pan et al., 2025) protects each agent's *fixed prefix* (shared preamble and
role prompt) by how soon the agent will run again, read off a static Agent Step Graph,
and treats workflow-specific suffixes as evictable first. Its eviction order (§5.2):
dynamic suffixes first (LRU), then fixed-prefix nodes by *descending*
steps-to-execution (the minimum over the agents sharing the node), LRU last; it
prefetches the fixed prefixes of next-step agents ahead of use.

Steps-to-execution of agent ``a`` is the minimum, over active workflows, of the
shortest-path distance in the step graph from the workflow's current agent to ``a``
(0 for an agent running now). It is written to each fixed node's ``hint``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from pbkv.kvmanager.node import Node

UNREACHABLE = 1_000_000
"""Steps-to-execution of an agent no active workflow can reach."""


class StepGraph:
    """All-pairs shortest step distances of a static agent step graph.

    Args:
        edges: admissible transitions ``(src, dst)``; edges to ``END`` are ignored.
    """

    def __init__(self, edges: Iterable[tuple[str, str]]) -> None:
        successors: dict[str, set[str]] = {}
        for src, dst in edges:
            successors.setdefault(src, set())
            if dst != "END":
                successors[src].add(dst)
                successors.setdefault(dst, set())
        self.agents = tuple(sorted(successors))
        self._distance = {a: _bfs(a, successors) for a in self.agents}

    def distance(self, src: str, dst: str) -> int:
        """Return the fewest steps from ``src`` running now to ``dst`` running (0 if equal)."""
        return self._distance.get(src, {}).get(dst, UNREACHABLE)


def _bfs(start: str, successors: dict[str, set[str]]) -> dict[str, int]:
    dist = {start: 0}
    queue = deque([start])
    while queue:
        a = queue.popleft()
        for b in successors[a]:
            if b not in dist:
                dist[b] = dist[a] + 1
                queue.append(b)
    return dist


class KVFlowTracker:
    """Keep every fixed-prefix node's steps-to-execution current.

    Args:
        graph: the app's static step graph.
        reprioritize: called with each node whose ``hint`` changed.
    """

    def __init__(self, graph: StepGraph, reprioritize: Callable[[Node], None]) -> None:
        self.graph = graph
        self._reprioritize = reprioritize
        self._current: dict[str, str] = {}
        self._fixed: dict[str, set[Node]] = {}
        self._ste: dict[str, int] = {}

    def steps_to_execution(self, agent: str) -> int:
        return self._ste.get(agent, UNREACHABLE)

    def mark_fixed(self, nodes: Iterable[Node], agent: str) -> None:
        """Record ``nodes`` as part of ``agent``'s fixed prefix. Mutates node hints."""
        for node in nodes:
            if agent not in node.fixed_agents:
                node.fixed_agents.add(agent)
                self._fixed.setdefault(agent, set()).add(node)
                self._rehint(node)

    def on_agent_invoked(self, workflow_id: str, agent: str) -> None:
        self._current[workflow_id] = agent
        self._refresh()

    def on_terminated(self, workflow_id: str) -> None:
        if self._current.pop(workflow_id, None) is not None:
            self._refresh()

    def next_step_agents(self) -> set[str]:
        """Return the agents one step from running in some active workflow."""
        return {a for a, s in self._ste.items() if s == 1}

    def fixed_nodes(self, agent: str) -> set[Node]:
        return self._fixed.get(agent, set())

    def on_split(self, node: Node, top: Node) -> None:
        for agent in top.fixed_agents:
            self._fixed.setdefault(agent, set()).add(top)

    def on_remove(self, node: Node) -> None:
        for agent in node.fixed_agents:
            self._fixed.get(agent, set()).discard(node)

    def _refresh(self) -> None:
        ste = {
            a: min((self.graph.distance(c, a) for c in self._current.values()), default=UNREACHABLE)
            for a in {*self.graph.agents, *self._fixed}
        }
        changed = {a for a, s in ste.items() if self._ste.get(a) != s}
        self._ste = ste
        for node in {n for a in changed for n in self._fixed.get(a, ())}:
            self._rehint(node)

    def _rehint(self, node: Node) -> None:
        hint = float(min(self.steps_to_execution(a) for a in node.fixed_agents))
        if hint != node.hint:
            node.hint = hint
            self._reprioritize(node)
