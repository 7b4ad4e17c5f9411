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

from pbkv.actors.workload import Segment, Workflow
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
    "TokenPrompt",
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
    """What a tool returned (routers read ``text`` as they read a :class:`Reply`'s).

    ``token_ids``: the tool message's exact ids in the context (a simulated tool of an
    app that tokenizes piece by piece); empty = ``text`` rendered as a tool message.
    """

    tool: str
    text: str
    latency_s: float
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    """A whole prompt as token-id segments, which a prompt builder may return instead of
    messages (apps that tokenize piece by piece, so shared parts are id-identical).

    Args:
        segments: ``preamble``, ``role`` and ``context`` segments, the assistant
            opener included; the app's preamble and the agent's role are not added.
        context_tail: the newest text of the context, for text-reading predictors.
    """

    segments: tuple[Segment, ...]
    context_tail: str = ""


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


PromptBuilder = Callable[[State], Sequence[Mapping[str, Any]] | TokenPrompt]
"""State → the context messages (after the system prompt) of an agent's next call, or
the whole prompt as a :class:`TokenPrompt`."""
SimulateReply = Callable[[State], Simulated]
Router = Callable[[State, Reply | ToolResult], str | Sequence[str]]
ToolFunction = Callable[[State], Awaitable[str] | str]
"""State → the tool's output text: an ``async def`` or a plain function."""
SimulateTool = Callable[[State], tuple[str, float] | ToolResult]
TaskSource = Callable[[int, int], LiveTask]
"""``(seed, index)`` → task ``index`` of the workload drawn with ``seed``."""


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
        TypeError: a ``preamble`` that is not text, or a ``recursion_limit`` that is
            not an int.
    """

    def __init__(self, name: str, *, preamble: str = "", recursion_limit: int = 25) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"app name must be a non-empty string, got {name!r}")
        if not isinstance(preamble, str):
            raise TypeError(f"app {name!r}: preamble must be a str, got {type(preamble).__name__}")
        _check_int(f"app {name!r}", "recursion_limit", recursion_limit, minimum=1)
        self.name = name
        self.preamble = preamble
        self.recursion_limit = recursion_limit
        self.nodes: dict[str, AgentNode | ToolNode] = {}
        self.static_edges: dict[str, list[str]] = {}
        self.routers: dict[str, RouterEdge] = {}
        self.task_source: TaskSource | None = None

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
            max_visits: runs allowed per workflow (an int >= 0, or ``None`` for no
                cap); one more ends it ``recursion_limit`` (a retry cap; ``0``: reaching
                the node ends the workflow).
            max_retries: retries (an int >= 0) of a call the engine failed before the
                workflow ends ``error``.

        Returns:
            The app, for chaining.

        Raises:
            ValueError: a taken or reserved name, a ``max_new_tokens < 1``, a negative
                ``max_visits`` or ``max_retries`` (the agent and field are named).
            TypeError: a field of the wrong type: ``role`` not a str, ``prompt`` or
                ``simulate`` not callable, ``sampling`` not a :class:`Sampling`, a
                count not an int.
        """
        self._check_new(name)
        owner = f"agent {name!r}"
        if not isinstance(role, str):
            raise TypeError(f"{owner}: role must be a str, got {type(role).__name__}")
        _check_callable(owner, "prompt", prompt, optional=True)
        _check_callable(owner, "simulate", simulate, optional=True)
        if not isinstance(sampling, Sampling):
            raise TypeError(
                f"{owner}: sampling must be a pbkv.Sampling, got {type(sampling).__name__}"
            )
        _check_int(owner, "max_new_tokens", max_new_tokens, minimum=1)
        _check_int(owner, "max_retries", max_retries, minimum=0)
        if max_visits is not None:
            _check_int(owner, "max_visits", max_visits, minimum=0)
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
        """Declare a tool: ``run(state)`` returns its output text.

        ``run`` may be an ``async def`` (awaited) or a plain function (called in the
        event loop, so it should be quick: a slow one blocks every workflow; wrap
        blocking work in ``trio.to_thread.run_sync``). On real engines the function
        runs and its wall-clock latency counts; on the sim engine ``simulate(state)``
        gives ``(text, latency_s)`` (or a :class:`ToolResult` with the message's exact
        ids) in virtual time (without it the function runs there too, at no virtual
        cost). ``max_visits`` caps its runs as :meth:`agent`'s does.

        Raises:
            ValueError: a taken or reserved name, or a negative ``max_visits``.
            TypeError: ``run`` or ``simulate`` not callable, ``max_visits`` not an int.
        """
        self._check_new(name)
        owner = f"tool {name!r}"
        _check_callable(owner, "run", run, optional=False)
        _check_callable(owner, "simulate", simulate, optional=True)
        if max_visits is not None:
            _check_int(owner, "max_visits", max_visits, minimum=0)
        self.nodes[name] = ToolNode(name, run, simulate, max_visits)
        return self

    def edge(self, source: str, target: str) -> App:
        """Declare a static edge; ``source`` may be :data:`START`, ``target`` :data:`END`.

        Raises:
            ValueError: an unknown node, or ``source`` already has a router.
            TypeError: ``source`` or ``target`` is not a node name (a str).
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
            TypeError: ``router`` not callable, or ``targets`` not a sequence of node
                names (a bare string is refused: write ``["coder"]``, not ``"coder"``).
        """
        _check_callable(f"router of {source!r}", "router", router, optional=False)
        if isinstance(targets, str) or not isinstance(targets, Sequence):
            hint = f"; write [{targets!r}]" if isinstance(targets, str) else ""
            raise TypeError(
                f"router of {source!r}: targets must be a sequence of node names, "
                f"got {type(targets).__name__} {targets!r}{hint}"
            )
        if not targets:
            raise ValueError(f"router of {source!r} must declare its targets")
        self._check_endpoints(source, targets)
        if source in self.static_edges or source in self.routers:
            raise ValueError(f"node {source!r} already has outgoing edges")
        self.routers[source] = RouterEdge(source, router, tuple(targets))
        return self

    def tasks(self, source: TaskSource) -> App:
        """Declare where workloads of this app come from: ``source(seed, index)`` returns
        task ``index`` of the workload drawn with ``seed`` (see :meth:`generate`).

        Returns:
            The app, for chaining.
        """
        if not callable(source):
            raise TypeError(f"task source must be callable, got {type(source).__name__}")
        self.task_source = source
        return self

    # -- workloads -----------------------------------------------------------------

    def task(self, seed: int, index: int) -> LiveTask:
        """Return task ``index`` of ``seed``: the declared source's, or the default task
        (id ``f"{seed}-{index}"``, text ``f"Task {index} of workload {seed}."``, no
        features; simulated replies then draw from streams hashed from the id).

        Raises:
            TypeError: the source returned something other than a :class:`LiveTask`.
        """
        if self.task_source is None:
            return LiveTask(f"{seed}-{index}", f"Task {index} of workload {seed}.")
        task = self.task_source(seed, index)
        if not isinstance(task, LiveTask):
            raise TypeError(
                f"app {self.name!r}: task source returned {type(task).__name__}, not LiveTask"
            )
        return task

    def generate(self, n_workflows: int, seed: int) -> list[Workflow]:
        """Dry-run the app on ``n_workflows`` tasks of ``seed``: the studies' workload.

        Workflow ``i`` is :func:`~pbkv.live.driver.simulate_workflow` of
        ``self.task(seed, i)`` with id ``f"{name}-{seed}-{i}"`` (SmolLM2's tokenizer),
        so it depends only on ``(seed, i)``.

        Raises:
            ValueError: ``n_workflows`` or ``seed`` is negative; or as
                :func:`~pbkv.live.driver.simulate_workflow`.
        """
        from pbkv.live.driver import simulate_workload

        return simulate_workload(self, n_workflows, seed)

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
        return tuple(sorted(self._next_agents(START) - {END}))

    @property
    def edges(self) -> tuple[tuple[str, str], ...]:
        """The call graph's agent → agent (or :data:`END`) edges, tools collapsed.

        An agent whose way on reaches a node with ``max_visits`` also leads to
        :data:`END`: the cap may end the workflow (``recursion_limit``) right after it.
        """
        out = {(a, b) for a in self.agents for b in self._next_agents(a)}
        return tuple(sorted(out))

    def validate(self) -> None:
        """Check the graph: nodes, an entry, every node reachable, every node with a way
        out, no entry node capped at zero visits, a valid ``recursion_limit``.

        :func:`~pbkv.live.driver.run_workflow`, :func:`~pbkv.live.driver.serve_app`
        and the dry runs call it before running (once per call).

        Raises:
            ValueError: the first problem found, naming the node.
            TypeError: ``recursion_limit`` is not an int.
        """
        _check_int(f"app {self.name!r}", "recursion_limit", self.recursion_limit, minimum=1)
        if not self.nodes:
            raise ValueError(f"app {self.name!r} declares no agents or tools")
        if not self.entry_nodes:
            raise ValueError(
                f"app {self.name!r} has no edge from START (add app.edge(START, node))"
            )
        if all(n == END for n in self.entry_nodes):
            raise ValueError(f"app {self.name!r}: START leads only to END; no node would run")
        for node in self.entry_nodes:
            if node != END and self.nodes[node].max_visits == 0:
                raise ValueError(
                    f"node {node!r} follows START but has max_visits=0: "
                    "every workflow would end recursion_limit before it runs"
                )
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
        """Agents (or END) reachable from ``node`` through tools only; END also when a
        capped node is on the way (its cap may end the workflow there)."""
        out: set[str] = set()
        seen: set[str] = set()
        stack = list(self.successors(node))
        while stack:
            nxt = stack.pop()
            if nxt != END and self.nodes[nxt].max_visits is not None:
                out.add(END)
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
        for end in (source, *targets):
            if not isinstance(end, str):
                raise TypeError(f"edge ends must be node names (str), got {end!r}")
        if source != START and source not in self.nodes:
            raise ValueError(f"unknown node {source!r}; declare it before its edges")
        for target in targets:
            if target != END and target not in self.nodes:
                raise ValueError(f"unknown node {target!r}; declare it before its edges")


def _check_int(owner: str, name: str, value: Any, *, minimum: int) -> None:
    """Refuse a count that is not an int (``bool`` included) or is below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value}")


def _check_callable(owner: str, name: str, value: Any, *, optional: bool) -> None:
    """Refuse a hook that is not callable (``None`` too, unless ``optional``)."""
    if value is None and optional:
        return
    if not callable(value):
        raise TypeError(f"{owner}: {name} must be callable, got {type(value).__name__} {value!r}")
