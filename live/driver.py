"""Run graph apps on a live runtime, replay recorded workflows, and dry-run apps into scripts.

One executor serves three callers: :func:`run_workflow` drives one task through an
:class:`~pbkv.live.graph.App` on a runtime (routing on real text, or on simulated
replies on the sim engine); :func:`simulate_workflow` walks the same graph with the
simulated replies and no engine, producing the :class:`~pbkv.actors.workload.Workflow`
script the studies and the predictor's traces use; :func:`replay_workflow` serves a
recorded script through a session. :func:`serve_app` and :func:`serve_replays` run many,
``concurrency`` at a time, honouring arrival times when a workload gives them.

Each runner validates the app's graph once before it runs (:meth:`App.validate`). An
error of the app's own code (a router, tool, prompt builder or simulated reply that
raises) is re-raised as :class:`NodeFailed` naming the node and what it was doing, the
original chained; a hook that returns something the graph cannot use is a ``TypeError``
or ``ValueError`` naming the node and what was expected. Graph and replay calls wait for
the runtime's admission limit (``max_calls_in_flight``) rather than fail with
:class:`~pbkv.live.session.Overloaded`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from pbkv.actors.events import TerminationReason
from pbkv.actors.workflow import WorkflowOutcome
from pbkv.actors.workload import Segment, Step, Workflow
from pbkv.engines.base import GenerateResult, Sampling
from pbkv.live.call import CallFailed, Overloaded, Reply
from pbkv.live.chat import ChatFormat, message_parts
from pbkv.live.graph import (
    END,
    AgentNode,
    App,
    LiveTask,
    State,
    TokenPrompt,
    ToolNode,
    ToolResult,
    Turn,
)
from pbkv.live.session import Runtime
from pbkv.live.simulated import Simulated, scripted_output
from pbkv.live.workflow import WorkflowSession
from pbkv.runtime import now_s

log = logging.getLogger(__name__)

EMPTY_OUTPUT_TOKEN = 0
"""The token a replayed step with an empty recorded output generates (an engine always
generates at least one)."""

OVERLOADED_RETRY_S = 0.01
"""Seconds a graph or replay call waits before asking again when the runtime refused it
as :class:`~pbkv.live.session.Overloaded` (calls from outside the graph, such as other
sessions or the server's, hold the capacity)."""


class NodeFailed(RuntimeError):
    """A node's own code raised: the workflow's error names the node and what it did.

    The original exception is chained (``__cause__``), so tracebacks show it.

    Attributes:
        node: the node (agent or tool) whose code raised.
        part: what it was doing: ``router``, ``tool``, ``prompt builder``,
            ``simulate`` (a simulated reply or tool result) or ``call`` (the runtime
            refused the agent's call, e.g. ``PromptTooLong``).
    """

    def __init__(self, node: str, part: str, error: BaseException) -> None:
        super().__init__(f"node {node!r} ({part}) raised {type(error).__name__}: {error}")
        self.node = node
        self.part = part


class Caller(Protocol):
    """What the executor calls agents through: a live session or a dry run."""

    samples_tokens: bool
    concurrent: bool
    """Whether a fan-out's branches run concurrently (live); a dry run takes them one by
    one in frontier order, so its script is the same in every process."""

    async def call(
        self,
        agent: str,
        prompt: Sequence[Segment],
        *,
        max_new_tokens: int,
        sampling: Sampling,
        simulated: Simulated | None,
        context_tail: str,
        step: int | None,
    ) -> Reply: ...

    async def sleep(self, seconds: float) -> None:
        """Spend a tool's modelled latency (virtual time on the sim engine)."""


# -- prompts ------------------------------------------------------------------------


def speaker_name(agent: str) -> str:
    """Return how ``agent`` signs its messages: ``query_rewriter`` → ``QueryRewriter``."""
    return agent.replace("_", " ").title().replace(" ", "")


@functools.lru_cache(maxsize=4096)
def _encoded(chat: ChatFormat, text: str) -> tuple[int, ...]:
    return chat.encode(text)


def system_segments(chat: ChatFormat, app: App, agent: AgentNode) -> tuple[Segment, Segment]:
    """Return the shared ``preamble`` and ``agent``'s ``role`` segment (tokenized once)."""
    preamble = _encoded(chat, f"<|im_start|>system\n{app.preamble}\n\n")
    role = _encoded(chat, f"{agent.role}{chat.stop_text}\n")
    return Segment("preamble", preamble), Segment("role", role)


def transcript(chat: ChatFormat, state: State) -> tuple[int, ...]:
    """Return the default context: the task as a user message, then every turn.

    An agent's turn is its signed opener plus its exact output ids (closed with the
    end-of-turn marker when it was cut off), so each prompt extends the last one's
    prompt + output and the cache is reused; a tool's turn is its tool message.
    """
    ids = _encoded(chat, chat.render("user", state.task.text))
    stop = _encoded(chat, chat.stop_text)
    for turn in state.turns:
        if turn.kind == "tool":
            ids += turn.token_ids
            continue
        closed = turn.token_ids[-len(stop) :] == stop
        ids += _encoded(chat, chat.opener(speaker_name(turn.node))) + turn.token_ids
        ids += _encoded(chat, "\n") if closed else stop + _encoded(chat, "\n")
    return ids


def agent_prompt(chat: ChatFormat, app: App, agent: AgentNode, state: State) -> tuple[Segment, ...]:
    """Return the segments of ``agent``'s next call: system, context, signed opener."""
    return agent_call_prompt(chat, app, agent, state).segments


def agent_call_prompt(chat: ChatFormat, app: App, agent: AgentNode, state: State) -> TokenPrompt:
    """Return ``agent``'s next prompt and its context tail.

    A builder's :class:`~pbkv.live.graph.TokenPrompt` is taken as it is; otherwise the
    segments are system, context (the builder's messages or the default transcript)
    and signed opener, and the tail is the newest turn's text (the task's at first).
    The builder's messages are checked as :meth:`WorkflowSession.call` checks its own
    (:func:`~pbkv.live.chat.message_parts`).

    Raises:
        NodeFailed: the prompt builder raised (chained).
        TypeError / ValueError: it returned neither messages, a ``TokenPrompt`` nor
            ``None``, or a bad message (the agent and the message's index named).
    """
    built = None
    if agent.prompt is not None:
        try:
            built = agent.prompt(state)
        except Exception as exc:
            raise NodeFailed(agent.name, "prompt builder", exc) from exc
    if isinstance(built, TokenPrompt):
        return built
    if built is None:
        context = transcript(chat, state)
    else:
        context = tuple(
            t for text in _built_messages(chat, agent, built) for t in _encoded(chat, text)
        )
    opener = _encoded(chat, chat.opener(speaker_name(agent.name)))
    segments = (*system_segments(chat, app, agent), Segment("context", context + opener))
    last = state.last
    return TokenPrompt(segments, last.text if last is not None else state.task.text)


def _built_messages(chat: ChatFormat, agent: AgentNode, built: Any) -> list[str]:
    """Return a prompt builder's messages rendered one by one, each checked."""
    if isinstance(built, (str, bytes, Mapping)) or not isinstance(built, Sequence):
        raise TypeError(
            f"prompt builder of agent {agent.name!r} returned {type(built).__name__}; expected "
            "a list of {'role': ..., 'content': ...} messages, a TokenPrompt or None"
        )
    rendered = []
    for i, message in enumerate(built):
        try:
            role, text = message_parts(i, message)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"prompt builder of agent {agent.name!r}: {exc}") from exc
        rendered.append(chat.render(role, text))
    return rendered


# -- the executor -------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    app: App
    chat: ChatFormat
    caller: Caller
    state: State
    replies: list[Reply]
    path: list[str]


async def execute(run: _Run) -> TerminationReason:
    """Run ``run.app`` on ``run.state`` superstep by superstep; return the end reason.

    Raises:
        CallFailed: a call failed past its agent's retries.
        NodeFailed: a router, prompt builder, tool or simulated reply raised (chained).
        TypeError / ValueError: one returned what the graph cannot use (a router a
            node it did not declare), the node named.
    """
    app, state = run.app, run.state
    frontier = list(app.entry_nodes)
    for _ in range(app.recursion_limit):
        frontier = [n for n in dict.fromkeys(frontier) if n != END]
        if not frontier:
            return "end"
        for name in frontier:
            cap = app.nodes[name].max_visits
            if cap is not None and state.visits[name] >= cap:
                return "recursion_limit"
        outputs = await _run_superstep(run, frontier)
        nxt: list[str] = []
        for name, out in zip(frontier, outputs, strict=True):
            assert out is not None
            state.visits[name] += 1
            state.turns.append(_turn(run, name, out))
            nxt += _successors(app, state, name, out)
        frontier = nxt
    frontier = [n for n in frontier if n != END]
    return "recursion_limit" if frontier else "end"


async def _run_superstep(run: _Run, frontier: list[str]) -> list[Reply | ToolResult | None]:
    """Run the frontier's nodes concurrently (fan-out); return their outputs in order.

    The first branch that raises cancels the others, and its error is raised as it is
    (not wrapped in an exception group, so the workflow's error names its node).
    """
    outputs: list[Reply | ToolResult | None] = [None] * len(frontier)
    if len(frontier) == 1 or not run.caller.concurrent:
        for i, name in enumerate(frontier):
            outputs[i] = await _run_node(run, name)
        return outputs
    failed: list[Exception] = []

    async def one(i: int, name: str, cancel: trio.CancelScope) -> None:
        try:
            outputs[i] = await _run_node(run, name)
        except Exception as exc:
            failed.append(exc)
            cancel.cancel()

    async with trio.open_nursery() as nursery:
        for i, name in enumerate(frontier):
            nursery.start_soon(one, i, name, nursery.cancel_scope)
    if failed:
        raise failed[0]
    return outputs


async def _run_node(run: _Run, name: str) -> Reply | ToolResult:
    node = run.app.nodes[name]
    if isinstance(node, ToolNode):
        return await _run_tool(run, node)
    prompt = agent_call_prompt(run.chat, run.app, node, run.state)
    simulated = None
    if node.simulate is not None and not run.caller.samples_tokens:
        try:
            simulated = node.simulate(run.state)
        except Exception as exc:
            raise NodeFailed(name, "simulate", exc) from exc
        if not isinstance(simulated, Simulated):
            raise TypeError(
                f"simulate of agent {name!r} returned {type(simulated).__name__}; "
                "expected a pbkv.Simulated"
            )
    step: int | None = None
    attempt = 0
    while True:
        try:
            reply = await run.caller.call(
                name,
                prompt.segments,
                max_new_tokens=node.max_new_tokens,
                sampling=node.sampling,
                simulated=simulated,
                context_tail=prompt.context_tail,
                step=step,
            )
        except CallFailed as exc:
            if attempt >= node.max_retries or not exc.retryable:
                raise
            log.warning("workflow %s: %s failed (%s); retrying", run.state.workflow_id, name, exc)
            step = exc.step
            attempt += 1
            continue
        except (TypeError, ValueError) as exc:  # the runtime refused the call's arguments
            raise NodeFailed(name, "call", exc) from exc
        run.replies.append(reply)
        run.path.append(name)
        return reply


async def _run_tool(run: _Run, node: ToolNode) -> ToolResult:
    if node.simulate is not None and not run.caller.samples_tokens:
        try:
            simulated = node.simulate(run.state)
        except Exception as exc:
            raise NodeFailed(node.name, "simulate", exc) from exc
        simulated = _tool_result(node.name, simulated)
        await run.caller.sleep(simulated.latency_s)
        return simulated
    started = now_s()
    try:
        text = node.run(run.state)  # an async def's coroutine, or a plain function's text
        if inspect.isawaitable(text):
            text = await text
    except Exception as exc:
        raise NodeFailed(node.name, "tool", exc) from exc
    if not isinstance(text, str):
        raise TypeError(f"tool {node.name!r} returned {type(text).__name__}; expected a str")
    return ToolResult(node.name, text, now_s() - started)


def _tool_result(name: str, simulated: Any) -> ToolResult:
    """Check a tool's simulated result: a :class:`ToolResult` or ``(text, latency_s)``."""
    if not isinstance(simulated, ToolResult):
        if not (
            isinstance(simulated, tuple)
            and len(simulated) == 2
            and isinstance(simulated[0], str)
            and isinstance(simulated[1], (int, float))
            and not isinstance(simulated[1], bool)
        ):
            raise TypeError(
                f"simulate of tool {name!r} returned {simulated!r}; expected "
                "(text, latency_s) or a ToolResult"
            )
        simulated = ToolResult(name, *simulated)
    if not (math.isfinite(simulated.latency_s) and simulated.latency_s >= 0):
        raise ValueError(
            f"simulate of tool {name!r} returned latency_s={simulated.latency_s!r}; "
            "expected a finite number of seconds >= 0"
        )
    return simulated


def _turn(run: _Run, name: str, out: Reply | ToolResult) -> Turn:
    if isinstance(out, Reply):
        return Turn(name, "agent", out.text, out.token_ids)
    ids = out.token_ids or _encoded(run.chat, run.chat.render("tool", out.text))
    return Turn(name, "tool", out.text, ids)


def _successors(app: App, state: State, name: str, out: Reply | ToolResult) -> list[str]:
    edge = app.routers.get(name)
    if edge is None:
        return list(app.static_edges.get(name, ()))
    try:
        chosen = edge.route(state, out)
    except Exception as exc:
        raise NodeFailed(name, "router", exc) from exc
    if isinstance(chosen, str):
        targets = [chosen]
    elif isinstance(chosen, Sequence) and chosen and all(isinstance(t, str) for t in chosen):
        targets = list(chosen)
    else:
        raise TypeError(
            f"router of {name!r} returned {chosen!r}; expected a node name, END, or a "
            f"non-empty sequence of them (one of {edge.targets})"
        )
    for target in targets:
        if target not in edge.targets:
            raise ValueError(
                f"router of {name!r} returned {target!r}, not one of its targets {edge.targets}"
            )
    return targets


# -- live runs ----------------------------------------------------------------------


async def admitted_call(session: WorkflowSession, agent: str, prompt: Any, **kwargs: Any) -> Reply:
    """Make ``session.call(agent, prompt, **kwargs)`` once the runtime can admit it.

    Graph and replay calls of one runtime share ``runtime.max_calls_in_flight`` slots
    (first come, first served), so they wait for capacity (backpressure) where a bare
    call would raise :class:`~pbkv.live.session.Overloaded`; a slot is held for one
    call only, so waiting never deadlocks (a fan-out's branches each take their own).
    When calls from outside (other sessions, the server) fill the runtime, the call
    asks again every :data:`OVERLOADED_RETRY_S`. Cancellation stops the wait.

    Raises:
        As :meth:`~pbkv.live.session.WorkflowSession.call`, except ``Overloaded``.
    """
    slots = session.runtime.call_slots
    try:
        slots.acquire_nowait()  # no checkpoint while there is room: schedules as before
    except trio.WouldBlock:
        await slots.acquire()
    try:
        while True:
            try:
                return await session.call(agent, prompt, **kwargs)
            except Overloaded as exc:
                await trio.sleep(min(exc.retry_after_s, OVERLOADED_RETRY_S))
    finally:
        slots.release()


class _SessionCaller:
    """Calls through a :class:`~pbkv.live.session.WorkflowSession`, waiting for room."""

    concurrent = True

    def __init__(self, session: WorkflowSession, samples_tokens: bool) -> None:
        self.session = session
        self.samples_tokens = samples_tokens

    async def call(self, agent: str, prompt: Sequence[Segment], **kwargs: Any) -> Reply:
        return await admitted_call(self.session, agent, prompt, **kwargs)

    async def sleep(self, seconds: float) -> None:
        """Wait a simulated tool's latency, scaled by the runtime's ``gap_scale``."""
        await trio.sleep(seconds * self.session.runtime.gap_scale)


async def run_workflow(
    runtime: Runtime,
    app: App,
    task: LiveTask,
    *,
    workflow_id: str | None = None,
    tenant: str = "",
    seed: int = 0,
) -> WorkflowOutcome:
    """Drive one workflow of ``app`` on ``task`` through ``runtime`` and return its outcome.

    A router, prompt builder or tool that raises, or a call that fails past its
    retries, ends this workflow with ``error`` (logged; ``outcome.error`` names the node
    and what it was doing, see :class:`NodeFailed`) and nothing else; cancellation ends
    it ``aborted`` and propagates. A call the runtime cannot admit yet waits for room.

    Args:
        runtime: a running :class:`~pbkv.live.session.Runtime`.
        app: the graph; ``task``: what it works on.
        workflow_id / tenant: the session's id and cache namespace.
        seed: seeds the simulated replies' streams (sim engine).

    Raises:
        ValueError / TypeError: the graph is broken (:meth:`App.validate`), before
            any workflow opens; or as :meth:`~pbkv.live.session.Runtime.open_workflow`.
    """
    app.validate()
    return await _run_workflow(
        runtime, app, task, workflow_id=workflow_id, tenant=tenant, seed=seed
    )


async def _run_workflow(
    runtime: Runtime,
    app: App,
    task: LiveTask,
    *,
    workflow_id: str | None = None,
    tenant: str = "",
    seed: int = 0,
) -> WorkflowOutcome:
    """:func:`run_workflow` of an app already validated."""
    session = await runtime.open_workflow(
        workflow_id, app=app.name, task_id=task.task_id, task_text=task.text, tenant=tenant
    )
    state = State(task, workflow_id=session.workflow_id, seed=seed)
    run = _Run(app, runtime.chat, _SessionCaller(session, runtime.samples_tokens), state, [], [])
    error = ""
    try:
        reason = await execute(run)
    except Exception as exc:
        log.warning("workflow %s ended with error: %r", session.workflow_id, exc)
        reason, error = "error", _error_text(exc)
    except BaseException:
        await session.end("aborted")
        raise
    await session.end(reason)
    return _outcome(session.workflow_id, reason, session.start_s, session.end_s, run, error)


def _error_text(exc: Exception) -> str:
    """Return ``WorkflowOutcome.error`` for ``exc``: a :class:`NodeFailed`'s message (it
    names the original type), else ``"Type: message"``."""
    return str(exc) if isinstance(exc, NodeFailed) else f"{type(exc).__name__}: {exc}"


def _outcome(
    workflow_id: str, reason: TerminationReason, start_s: float, end_s: float, run: _Run, error: str
) -> WorkflowOutcome:
    results = tuple(r.result for r in run.replies if r.result is not None)
    return WorkflowOutcome(workflow_id, reason, start_s, end_s, results, tuple(run.path), error)


# -- dry runs: an app's graph → a Workflow script ------------------------------------


class _DryRun:
    """Answers calls with the simulated replies and records them as script steps."""

    samples_tokens = False
    concurrent = False

    def __init__(self, chat: ChatFormat) -> None:
        self.chat = chat
        self.steps: list[Step] = []
        self._gap_s = 0.0

    async def call(
        self,
        agent: str,
        prompt: Sequence[Segment],
        *,
        max_new_tokens: int,
        simulated: Simulated | None,
        context_tail: str,
        step: int | None = None,
        **_: Any,
    ) -> Reply:
        output = scripted_output(self.chat, simulated, max_new_tokens)
        gap_s = self._gap_s + (simulated.gap_s if simulated is not None else 0.0)
        self._gap_s = 0.0
        self.steps.append(Step(agent, tuple(prompt), output, round(gap_s, 6), context_tail))
        prompt_tokens = sum(len(s.token_ids) for s in prompt)
        return Reply(
            agent,
            len(self.steps) - 1,
            self.chat.reply_text(output),
            output,
            prompt_tokens,
            0,
            0,
            prompt_tokens,
            0.0,
            0.0,
            "stop",
        )

    async def sleep(self, seconds: float) -> None:
        self._gap_s += seconds


def simulate_workflow(
    app: App, task: LiveTask, chat: ChatFormat, *, workflow_id: str, seed: int = 0
) -> Workflow:
    """Walk ``app`` on ``task`` with its simulated replies and no engine: the script.

    The steps are exactly the calls a live sim run makes (same prompts, same outputs,
    tool latencies folded into the next step's gap), so replaying the script and
    running the app live on the sim engine serve the same requests.

    An agent without ``simulate`` answers filler (its routers then see filler text); a
    tool without ``simulate`` runs its real function. A walk that needs an event loop
    (a tool that awaits) is restarted under ``trio.run``, so such a tool's function may
    run twice. A fan-out's branches are walked one by one in frontier order (a live run
    makes their calls concurrently), so the script is the same in every process.

    Raises:
        ValueError / TypeError: the graph is broken (:meth:`App.validate`); a hook
            returned what the graph cannot use (the node named).
        NodeFailed: a router, prompt builder, tool or simulated reply raised (chained).
    """
    app.validate()
    return _simulate_workflow(app, task, chat, workflow_id=workflow_id, seed=seed)


def _simulate_workflow(
    app: App, task: LiveTask, chat: ChatFormat, *, workflow_id: str, seed: int = 0
) -> Workflow:
    """:func:`simulate_workflow` of an app already validated."""
    dry = _DryRun(chat)
    state = State(task, workflow_id=workflow_id, seed=seed)
    run = _Run(app, chat, dry, state, [], [])
    reason = _run_at_once(execute(run))
    if reason is None:  # it needed trio (fan-out, a tool that sleeps): start over in a run
        dry = _DryRun(chat)
        run = _Run(app, chat, dry, State(task, workflow_id=workflow_id, seed=seed), [], [])
        reason = trio.run(execute, run)
    return Workflow(
        workflow_id=workflow_id,
        app=app.name,
        task_id=task.task_id,
        task_text=task.text,
        steps=tuple(dry.steps),
        task_features=dict(task.features),
        end_reason=reason,
    )


def _run_at_once(coroutine: Any) -> TerminationReason | None:
    """Run a dry run that never waits, without an event loop (most apps: no fan-out);
    return ``None``, the coroutine closed, when it needs trio."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    except (RuntimeError, AttributeError):
        # trio used outside a run: "must be called from async context" (RuntimeError), or
        # on trio 0.22 an AttributeError from its run context. Start over in a run; an
        # error of the app's own raises there again.
        if _in_trio_run():
            raise
        return None
    coroutine.close()
    return None


def _in_trio_run() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def simulate_workload(
    app: App, n_workflows: int, seed: int, chat: ChatFormat | None = None
) -> list[Workflow]:
    """Dry-run ``app`` on tasks ``0 .. n_workflows - 1`` of ``seed`` (see :meth:`App.generate`).

    Args:
        chat: the tokenizer and template; default SmolLM2's (the sim engine's).

    Raises:
        ValueError: ``n_workflows`` or ``seed`` is negative or not an int; or as
            :func:`simulate_workflow` (the graph is validated once).
    """
    for name, value in (("n_workflows", n_workflows), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if chat is None:
        from pbkv.live.build import SIM_CONTEXT_TOKENS
        from pbkv.live.chat import smollm2_chat

        chat = smollm2_chat(SIM_CONTEXT_TOKENS)
    app.validate()
    return [
        _simulate_workflow(
            app, app.task(seed, i), chat, workflow_id=f"{app.name}-{seed}-{i}", seed=seed
        )
        for i in range(n_workflows)
    ]


# -- replay ------------------------------------------------------------------------


async def replay_workflow(runtime: Runtime, workflow: Workflow) -> WorkflowOutcome:
    """Serve a recorded script through a session: each step after its gap, in order.

    A step the engine fails is retried once, then the workflow ends ``error``; the
    script's own end reason ends it otherwise. A step the runtime cannot admit yet
    waits for room (:func:`admitted_call`).
    """
    session = await runtime.open_workflow(
        workflow.workflow_id,
        app=workflow.app,
        task_id=workflow.task_id,
        task_text=workflow.task_text,
        tenant=workflow.tenant,
    )
    results: list[GenerateResult] = []
    reason: TerminationReason = workflow.end_reason  # type: ignore[assignment]
    error = ""
    try:
        for step in workflow.steps:
            if step.gap_s > 0:
                await trio.sleep(step.gap_s * runtime.gap_scale)
            reply = await _replay_step(session, step)
            if reply is None:
                reason, error = "error", f"{step.agent}: engine failed twice"
                break
            assert reply.result is not None
            results.append(reply.result)
    except BaseException:
        await session.end("aborted")
        raise
    await session.end(reason)
    path = tuple(s.agent for s in workflow.steps[: len(results)])
    return WorkflowOutcome(
        workflow.workflow_id, reason, session.start_s, session.end_s, tuple(results), path, error
    )


async def _replay_step(session: Any, step: Step, retries: int = 1) -> Reply | None:
    # an engine generates at least one token: an empty recorded output replays as one
    simulated = Simulated(token_ids=step.output_token_ids or (EMPTY_OUTPUT_TOKEN,))
    repeat: int | None = None
    for _ in range(retries + 1):
        try:
            return await admitted_call(
                session,
                step.agent,
                step.segments,
                max_new_tokens=max(1, step.output_tokens),
                simulated=simulated,
                context_tail=step.context_tail,
                step=repeat,
            )
        except CallFailed as exc:
            log.warning("workflow %s step %s failed: %s", session.workflow_id, step.agent, exc)
            if not exc.retryable:
                return None
            repeat = exc.step
    return None


# -- many at once --------------------------------------------------------------------


async def serve_many(
    starters: Sequence[Callable[[], Any]],
    *,
    concurrency: int,
    arrivals_s: Sequence[float] | None = None,
    on_outcome: Callable[[WorkflowOutcome], None] | None = None,
) -> list[WorkflowOutcome]:
    """Run ``starters`` (each an async callable returning an outcome) ``concurrency`` at
    a time, in order; with ``arrivals_s`` none starts before its arrival (open loop,
    seconds from now). Returns the outcomes in completion order.

    Raises:
        ValueError: ``concurrency < 1`` or ``arrivals_s`` of another length.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if arrivals_s is not None and len(arrivals_s) != len(starters):
        raise ValueError("arrivals_s must give one time per workflow")
    outcomes: list[WorkflowOutcome] = []
    slots = trio.Semaphore(concurrency)
    t0 = now_s()

    async def one(start: Callable[[], Any]) -> None:
        try:
            outcome = await start()
        finally:
            slots.release()
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    async with trio.open_nursery() as nursery:
        for i, start in enumerate(starters):
            if arrivals_s is not None:
                await trio.sleep_until(t0 + max(0.0, arrivals_s[i]))
            await slots.acquire()
            nursery.start_soon(one, start)
    return outcomes


async def serve_app(
    runtime: Runtime,
    app: App,
    tasks: Sequence[LiveTask],
    *,
    concurrency: int = 8,
    workflow_ids: Sequence[str] | None = None,
    arrivals_s: Sequence[float] | None = None,
    seed: int = 0,
    on_outcome: Callable[[WorkflowOutcome], None] | None = None,
) -> list[WorkflowOutcome]:
    """Run ``app`` on every task through ``runtime``, ``concurrency`` at a time.

    The graph is validated once, and the ids checked, before any workflow starts; the
    runtime's online forecaster starts from the graph's declared edges
    (:meth:`Runtime.warm_start`). A workflow's calls wait while the runtime is at its
    admission limit (``max_calls_in_flight``: the engine's batch plus its queue) rather
    than fail, so any ``concurrency`` is served, a fan-out's branches included.

    Args:
        runtime: a running :class:`~pbkv.live.session.Runtime`.
        app / tasks: the graph and what its workflows work on, one each.
        concurrency: workflows open at once (>= 1).
        workflow_ids: one unique, non-empty id per task, none open in ``runtime``;
            default ``f"{app.name}-{i}"``.
        arrivals_s: each workflow's earliest start, seconds from now (open loop).
        seed: seeds the simulated replies' streams (sim engine).
        on_outcome: called with each outcome as its workflow ends.

    Returns:
        The outcomes, in completion order.

    Raises:
        ValueError: as :func:`serve_many`; ``workflow_ids`` of another length, with a
            duplicate, an empty id or one already open (named); a broken graph
            (:meth:`App.validate`).
        TypeError: as :meth:`App.validate`.
    """
    app.validate()
    ids = (
        list(workflow_ids)
        if workflow_ids is not None
        else [f"{app.name}-{i}" for i in range(len(tasks))]
    )
    if len(ids) != len(tasks):
        raise ValueError("workflow_ids must give one id per task")
    _check_ids(runtime, ids)
    runtime.warm_start(app.name, app.agents, app.edges)
    starters = [
        functools.partial(_run_workflow, runtime, app, task, workflow_id=wf_id, seed=seed)
        for task, wf_id in zip(tasks, ids, strict=True)
    ]
    return await serve_many(
        starters, concurrency=concurrency, arrivals_s=arrivals_s, on_outcome=on_outcome
    )


def _check_ids(runtime: Runtime, ids: Sequence[str]) -> None:
    """Refuse workflow ids that :meth:`Runtime.open_workflow` would refuse mid-run."""
    for wf_id in ids:
        if not isinstance(wf_id, str) or not wf_id:
            raise ValueError(f"workflow_ids must be non-empty strings, got {wf_id!r}")
    duplicated = [wf_id for wf_id, n in Counter(ids).items() if n > 1]
    if duplicated:
        raise ValueError(
            f"workflow_ids must be unique; {duplicated[0]!r} is given "
            f"{Counter(ids)[duplicated[0]]} times"
        )
    open_now = sorted(set(ids) & set(runtime.active_workflows()))
    if open_now:
        raise ValueError(f"workflow {open_now[0]!r} is already open in this runtime")


async def serve_replays(
    runtime: Runtime,
    workflows: Sequence[Workflow],
    *,
    concurrency: int = 8,
    open_loop: bool = False,
    on_outcome: Callable[[WorkflowOutcome], None] | None = None,
) -> list[WorkflowOutcome]:
    """Replay ``workflows`` through ``runtime``, ``concurrency`` at a time.

    Args:
        open_loop: start each workflow no earlier than its ``arrival_s``.
    """
    arrivals = [w.arrival_s for w in workflows] if open_loop else None
    starters = [functools.partial(replay_workflow, runtime, w) for w in workflows]
    return await serve_many(
        starters, concurrency=concurrency, arrivals_s=arrivals, on_outcome=on_outcome
    )
