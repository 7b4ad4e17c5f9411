"""Run graph apps on a live runtime, replay recorded workflows, and serve many at once.

One executor (:mod:`~pbkv.live.executor`) serves three callers: :func:`run_workflow`
drives one task through an :class:`~pbkv.live.graph.App` on a runtime (routing on real
text, or on simulated replies on the sim engine); :func:`simulate_workflow`
(:mod:`~pbkv.live.dry_run`, re-exported here) walks the same graph with the simulated
replies and no engine, producing the :class:`~pbkv.actors.workload.Workflow` script the
studies and the predictor's traces use; :func:`replay_workflow` serves a recorded script
through a session. :func:`serve_app` and :func:`serve_replays` run many,
``concurrency`` at a time, honouring arrival times when a workload gives them.

Each runner validates the app's graph once before it runs (:meth:`App.validate`). An
error of the app's own code (a router, tool, prompt builder or simulated reply that
raises) is re-raised as :class:`~pbkv.live.errors.NodeFailed` naming the node and what
it was doing, the original chained; a hook that returns something the graph cannot use
is a ``TypeError`` or ``ValueError`` naming the node and what was expected. Graph and
replay calls wait for the runtime's admission limit (``max_calls_in_flight``) rather
than fail with :class:`~pbkv.live.call.Overloaded`.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import trio

from pbkv.actors.events import TerminationReason
from pbkv.actors.workflow import WorkflowOutcome
from pbkv.actors.workload import Segment, Step, Workflow
from pbkv.engines.base import GenerateResult
from pbkv.live.call import CallFailed, Overloaded, Reply
from pbkv.live.dry_run import simulate_workflow, simulate_workload
from pbkv.live.errors import NodeFailed
from pbkv.live.executor import GraphRun, execute
from pbkv.live.graph import App, LiveTask, State
from pbkv.live.session import Runtime
from pbkv.live.simulated import Simulated
from pbkv.live.workflow import WorkflowSession
from pbkv.runtime import now_s

# NodeFailed, simulate_workflow and simulate_workload: re-exported for their importers here
__all__ = [
    "EMPTY_OUTPUT_TOKEN",
    "OVERLOADED_RETRY_S",
    "NodeFailed",
    "admitted_call",
    "replay_workflow",
    "run_workflow",
    "serve_app",
    "serve_many",
    "serve_replays",
    "simulate_workflow",
    "simulate_workload",
]

log = logging.getLogger(__name__)

EMPTY_OUTPUT_TOKEN = 0
"""The token a replayed step with an empty recorded output generates (an engine always
generates at least one)."""

OVERLOADED_RETRY_S = 0.01
"""Seconds a graph or replay call waits before asking again when the runtime refused it
as :class:`~pbkv.live.call.Overloaded` (calls from outside the graph, such as other
sessions or the server's, hold the capacity)."""


async def admitted_call(session: WorkflowSession, agent: str, prompt: Any, **kwargs: Any) -> Reply:
    """Make ``session.call(agent, prompt, **kwargs)`` once the runtime can admit it.

    Graph and replay calls of one runtime share ``runtime.max_calls_in_flight`` slots
    (first come, first served), so they wait for capacity (backpressure) where a bare
    call would raise :class:`~pbkv.live.call.Overloaded`; a slot is held for one
    call only, so waiting never deadlocks (a fan-out's branches each take their own).
    When calls from outside (other sessions, the server) fill the runtime, the call
    asks again every :data:`OVERLOADED_RETRY_S`. Cancellation stops the wait.

    Raises:
        As :meth:`~pbkv.live.workflow.WorkflowSession.call`, except ``Overloaded``.
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
    """Calls through a :class:`~pbkv.live.workflow.WorkflowSession`, waiting for room."""

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
    run = GraphRun(
        app, runtime.chat, _SessionCaller(session, runtime.samples_tokens), state, [], []
    )
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
    workflow_id: str,
    reason: TerminationReason,
    start_s: float,
    end_s: float,
    run: GraphRun,
    error: str,
) -> WorkflowOutcome:
    results = tuple(r.result for r in run.replies if r.result is not None)
    return WorkflowOutcome(workflow_id, reason, start_s, end_s, results, tuple(run.path), error)


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
