"""Dry runs: an app's graph walked with its simulated replies and no engine, as a script.

:func:`simulate_workflow` answers every call with its simulated reply (or filler) and
records it as a :class:`~pbkv.actors.workload.Step`, producing the
:class:`~pbkv.actors.workload.Workflow` script the studies and the predictor's traces
use; replaying it serves exactly the requests a live run on the sim engine makes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from pbkv.actors.events import TerminationReason
from pbkv.actors.workload import Segment, Step, Workflow
from pbkv.live.call import Reply
from pbkv.live.chat import ChatFormat
from pbkv.live.executor import GraphRun, execute
from pbkv.live.graph import App, LiveTask, State
from pbkv.live.simulated import Simulated, scripted_output


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
    run = GraphRun(app, chat, dry, state, [], [])
    reason = _run_at_once(execute(run))
    if reason is None:  # it needed trio (fan-out, a tool that sleeps): start over in a run
        dry = _DryRun(chat)
        run = GraphRun(app, chat, dry, State(task, workflow_id=workflow_id, seed=seed), [], [])
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
