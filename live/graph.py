"""The graph API: an app declared as agents, tools and routers (DESIGN §4.0).

An :class:`App` holds **agents** (role prompt, a prompt builder over the workflow
state, decode budget, sampling, optionally a *simulated reply* for the sim engine),
**tools** (async Python functions: non-LLM steps) and **edges**: static ones, and
**routers** (state + output → next node(s) or :data:`END`) with their declared
targets. A router returning several nodes fans out; the branches run concurrently and
the nodes they lead to run once (join). The call graph ``G`` the predictor and KVFlow
use is derived from the declared edges, tools collapsed, never written twice.

Execution (:mod:`pbkv.live.driver`) runs in *supersteps*: every node of the frontier
runs concurrently, then the frontier becomes the union of their successors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pbkv.engines.base import GREEDY, Sampling
from pbkv.live.session import Reply, Simulated
from pbkv.predictor.trace import END

START = "START"
"""The source of the edges that name a workflow's first node(s)."""

__all__ = [
    "END",
    "START",
    "AgentNode",
    "App",
    "LiveTask",
    "State",
    "ToolNode",
    "ToolResult",
    "Turn",
]


@dataclass(frozen=True, slots=True)
class LiveTask:
    """What one workflow works on.

    Args:
        task_id: stable id of the task.
        text: the task as the agents see it (the first user message).
        features: hidden features a simulated reply may draw on (never shown to a
            predictor).
        entropy / streams: with both set, :meth:`State.rng` of the k-th name in
            ``streams`` is child k of ``SeedSequence(entropy)`` (how the generated apps
            seed a workflow's draws); otherwise streams are hashed from the task id.
    """

    task_id: str
    text: str
    features: Mapping[str, Any] = field(default_factory=dict)
    entropy: tuple[int, ...] = ()
    streams: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Turn:
    """One node's output in the workflow's history.

    Args:
        node: the agent or tool that produced it.
        kind: ``agent`` or ``tool``.
        text: the output text.
        token_ids: an agent's exact output ids (so the next prompt extends the cache);
            a tool's rendered message ids.
    """

    node: str
    kind: str
    text: str
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returned (routers read ``text`` as they read a :class:`Reply`'s)."""

    tool: str
    text: str
    latency_s: float


@dataclass(slots=True)
class State:
    """The state of one running workflow, shared by its prompt builders and routers.

    Attributes:
        task: the task.
        turns: every output so far, in order (fan-out branches in declaration order).
        visits: how often each node has run.
        values: the app's own scratch space.
        workflow_id: the session's id.
    """

    task: LiveTask
    workflow_id: str = ""
    turns: list[Turn] = field(default_factory=list)
    visits: Counter[str] = field(default_factory=Counter)
    values: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    _rngs: dict[str, np.random.Generator] = field(default_factory=dict)

    @property
    def last(self) -> Turn | None:
        """The newest turn, or ``None`` before the first."""
        return self.turns[-1] if self.turns else None

    def rng(self, stream: str) -> np.random.Generator:
        """Return this workflow's generator named ``stream`` (for simulated replies).

        Each stream depends only on ``(seed, task_id, stream)``, so simulated routing
        is the same on every engine and under every policy.
        """
        rng = self._rngs.get(stream)
        if rng is None:
            task = self.task
            if task.entropy and stream in task.streams:
                children = np.random.SeedSequence(list(task.entropy)).spawn(len(task.streams))
                seq = children[task.streams.index(stream)]
            else:
                seq = np.random.SeedSequence(
                    [self.seed, *task.task_id.encode(), 0, *stream.encode()]
                )
            rng = self._rngs[stream] = np.random.default_rng(seq)
        return rng


PromptBuilder = Callable[[State], Sequence[Mapping[str, Any]]]
"""State → the context messages (after the system prompt) of an agent's next call."""
SimulateReply = Callable[[State], Simulated]
Router = Callable[[State, Reply | ToolResult], str | Sequence[str]]
ToolFunction = Callable[[State], Awaitable[str]]
SimulateTool = Callable[[State], tuple[str, float]]


@dataclass(frozen=True, slots=True)
class AgentNode:
    """An LLM agent of an app (see :meth:`App.agent`)."""

    name: str
    role: str
    prompt: PromptBuilder | None
    max_new_tokens: int
    sampling: Sampling
    simulate: SimulateReply | None
    max_visits: int | None
    max_retries: int


@dataclass(frozen=True, slots=True)
class ToolNode:
    """A non-LLM step of an app (see :meth:`App.tool`)."""

    name: str
    run: ToolFunction
    simulate: SimulateTool | None
    max_visits: int | None


@dataclass(frozen=True, slots=True)
class RouterEdge:
    """A router out of ``source`` and the targets it may return."""

    source: str
    route: Router
    targets: tuple[str, ...]


class App:
    """An agent app as a graph of agents, tools and routers.

    Args:
        name: the app's name (``Workflow.app`` of its traces; the predictor's key).
        preamble: the system text every agent shares (one cached prefix for all).
        recursion_limit: most supersteps a workflow may take before it ends with
            reason ``recursion_limit`` (LangGraph's default is 25).

    Raises:
        ValueError: empty name or ``recursion_limit < 1``.
    """

    def __init__(self, name: str, *, preamble: str = "", recursion_limit: int = 25) -> None:
        if not name:
            raise ValueError("app name must not be empty")
        if recursion_limit < 1:
            raise ValueError(f"recursion_limit must be >= 1, got {recursion_limit}")
        self.name = name
        self.preamble = preamble
        self.recursion_limit = recursion_limit
        self.nodes: dict[str, AgentNode | ToolNode] = {}
        self.static_edges: dict[str, list[str]] = {}
        self.routers: dict[str, RouterEdge] = {}

    # -- declaring --------------------------------------------------------------

    def agent(
        self,
        name: str,
        *,
        role: str,
        prompt: PromptBuilder | None = None,
        max_new_tokens: int = 256,
        sampling: Sampling = GREEDY,
        simulate: SimulateReply | None = None,
        max_visits: int | None = None,
        max_retries: int = 1,
    ) -> App:
        """Declare an LLM agent.

        Args:
            name: node name (also the agent name the KV manager and predictor see).
            role: the agent's role prompt (system text after the shared preamble).
            prompt: builds the context messages from the state; default: the task as a
                user message, then every earlier turn (agents' outputs as signed
                assistant messages, tools' as tool messages).
            max_new_tokens: decode budget.
            sampling: how a real engine samples this agent's tokens.
            simulate: the reply on the sim engine (text routers parse, length, gap).
            max_visits: runs allowed per workflow; one more ends it ``recursion_limit``
                (a retry cap).
            max_retries: retries of a call the engine failed before the workflow
                ends ``error``.

        Returns:
            The app, for chaining.

        Raises:
            ValueError: a taken or reserved name, or a non-positive budget.
        """
        self._check_new(name)
        if max_new_tokens < 1:
            raise ValueError(f"agent {name!r}: max_new_tokens must be >= 1")
        self.nodes[name] = AgentNode(
            name, role, prompt, max_new_tokens, sampling, simulate, max_visits, max_retries
        )
        return self

    def tool(
        self,
        name: str,
        run: ToolFunction,
        *,
        simulate: SimulateTool | None = None,
        max_visits: int | None = None,
    ) -> App:
        """Declare a tool: ``await run(state)`` returns its output text.

        On real engines the function runs and its wall-clock latency counts; on the sim
        engine ``simulate(state)`` gives ``(text, latency_s)`` in virtual time (without
        it the function runs there too, at no virtual cost).

        Raises:
            ValueError: a taken or reserved name.
        """
        self._check_new(name)
        self.nodes[name] = ToolNode(name, run, simulate, max_visits)
        return self

    def edge(self, source: str, target: str) -> App:
        """Declare a static edge; ``source`` may be :data:`START`, ``target`` :data:`END`.

        Raises:
            ValueError: an unknown node, or ``source`` already has a router.
        """
        self._check_endpoints(source, [target])
        if source in self.routers:
            raise ValueError(f"node {source!r} has a router; add {target!r} to its targets")
        self.static_edges.setdefault(source, []).append(target)
        return self

    def route(self, source: str, router: Router, targets: Sequence[str]) -> App:
        """Declare a router out of ``source``: ``router(state, output)`` returns a target,
        :data:`END`, or a list of targets (fan-out).

        Raises:
            ValueError: an unknown node, no targets, or ``source`` already has edges.
        """
        if not targets:
            raise ValueError(f"router of {source!r} must declare its targets")
        self._check_endpoints(source, targets)
        if source in self.static_edges or source in self.routers:
            raise ValueError(f"node {source!r} already has outgoing edges")
        self.routers[source] = RouterEdge(source, router, tuple(targets))
        return self

    # -- the call graph -----------------------------------------------------------

    @property
    def agents(self) -> tuple[str, ...]:
        """The LLM agents, in declaration order (the predictor's vocabulary)."""
        return tuple(n for n, node in self.nodes.items() if isinstance(node, AgentNode))

    def successors(self, node: str) -> tuple[str, ...]:
        """Return every node (or :data:`END`) ``node`` may lead to."""
        if node in self.routers:
            return self.routers[node].targets
        return tuple(self.static_edges.get(node, ()))

    @property
    def entry_nodes(self) -> tuple[str, ...]:
        return self.successors(START)

    @property
    def entry_agents(self) -> tuple[str, ...]:
        """The agents a workflow may start with (tools before them collapsed)."""
        return tuple(sorted(self._next_agents(START)))

    @property
    def edges(self) -> tuple[tuple[str, str], ...]:
        """The call graph's agent → agent (or :data:`END`) edges, tools collapsed."""
        out = {(a, b) for a in self.agents for b in self._next_agents(a)}
        return tuple(sorted(out))

    def validate(self) -> None:
        """Check the graph: an entry, every node reachable, every node with a way out.

        Raises:
            ValueError: the first problem found, naming the node.
        """
        if not self.entry_nodes:
            raise ValueError(f"app {self.name!r} has no edge from START")
        seen, stack = set(), list(self.entry_nodes)
        while stack:
            node = stack.pop()
            if node == END or node in seen:
                continue
            seen.add(node)
            if not self.successors(node):
                raise ValueError(f"node {node!r} has no outgoing edge (add one to END)")
            stack.extend(self.successors(node))
        unreachable = set(self.nodes) - seen
        if unreachable:
            raise ValueError(f"nodes {sorted(unreachable)} are not reachable from START")

    def _next_agents(self, node: str) -> set[str]:
        """Agents (or END) reachable from ``node`` through tools only."""
        out: set[str] = set()
        seen: set[str] = set()
        stack = list(self.successors(node))
        while stack:
            nxt = stack.pop()
            if nxt == END or isinstance(self.nodes.get(nxt), AgentNode):
                out.add(nxt)
            elif nxt not in seen:
                seen.add(nxt)
                stack.extend(self.successors(nxt))
        return out

    def _check_new(self, name: str) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"node name must be a non-empty string, got {name!r}")
        if name in (START, END):
            raise ValueError(f"{name!r} is reserved")
        if name in self.nodes:
            raise ValueError(f"node {name!r} is already declared")

    def _check_endpoints(self, source: str, targets: Sequence[str]) -> None:
        if source != START and source not in self.nodes:
            raise ValueError(f"unknown node {source!r}; declare it before its edges")
        for target in targets:
            if target != END and target not in self.nodes:
                raise ValueError(f"unknown node {target!r}; declare it before its edges")
