"""KVManagerActor: turns lifecycle events into score updates (§4, §5.3).

It tracks each workflow's executed path, asks the PredictorActor for a K-step
forecast on every invocation (and again when a prefill brings a hidden state), and
applies forecasts to the KV manager's scores. Forecast requests run as background
tasks so many are in flight at once (the predictor batches them); a forecast older
than the workflow's latest step, or for a terminated workflow, is dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import trio

from pbkv.actors.events import (
    RAN_TO_END,
    AgentFinished,
    AgentInvoked,
    ForecastRequest,
    PathObserved,
    PrefillDone,
    WorkflowStarted,
    WorkflowTerminated,
)
from pbkv.kvmanager import KVManager
from pbkv.runtime import Actor, ActorRef, ActorStopped, EventSink, TaskStatus

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _WorkflowView:
    app: str
    task_text: str
    tenant: str = ""
    path: list[str] = field(default_factory=list)
    step: int = -1
    context_tail: str = ""


class KVManagerActor(Actor):
    """Actor shell around a :class:`KVManager`.

    Args:
        kv: the synchronous core (shared with the engine's scheduler).
        predictor: the PredictorActor's ref, or ``None`` for policies without forecasts.
            It is told each ended workflow's path (:class:`PathObserved`) so an online
            forecaster learns; each forecast carries its own columns.
        recorder: if given, every lifecycle event is handed to it (an
            :class:`~pbkv.runtime.EventRecorder` appends it to a JSONL file, a
            :class:`~pbkv.actors.traces.TraceRecorder` builds the workflows' traces).
    """

    def __init__(
        self,
        kv: KVManager,
        predictor: ActorRef | None,
        *,
        recorder: EventSink | None = None,
        mailbox_capacity: int = 1024,
    ) -> None:
        super().__init__(mailbox_capacity=mailbox_capacity)
        self.kv = kv
        self.recorder = recorder
        self.predictor = predictor if kv.policy.uses_forecasts else None
        self._workflows: dict[str, _WorkflowView] = {}
        self._nursery: trio.Nursery | None = None
        self.forecasts_applied = 0
        self.forecasts_stale = 0
        self.paths_dropped = 0

    async def run(self, *, task_status: TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await super().run(task_status=task_status)
            nursery.cancel_scope.cancel()

    async def handle(self, msg: object) -> None:
        if self.recorder is not None:
            self.recorder.record(msg)  # type: ignore[arg-type]
        match msg:
            case WorkflowStarted(workflow_id=w, app=app, task_text=text, tenant=tenant):
                self._workflows[w] = _WorkflowView(app, text, tenant)
                self.kv.on_workflow_started(w)
            case AgentInvoked(workflow_id=w, step=step, agent=agent, context_tail=tail):
                view = self._workflows[w]
                view.context_tail = tail
                if step != view.step:  # a retry repeats its step: the path has it already
                    view.path.append(agent)
                view.step = step
                self.kv.on_agent_invoked(w, agent, step)
                self._request_forecast(w, view, None)
            case PrefillDone(workflow_id=w, hidden=hidden) if hidden is not None:
                known = self._workflows.get(w)
                if known is not None:
                    self._request_forecast(w, known, np.asarray(hidden, dtype=np.float32))
            case PrefillDone() | AgentFinished():
                pass
            case WorkflowTerminated(workflow_id=w, reason=reason):
                ended = self._workflows.pop(w, None)
                self.kv.on_workflow_terminated(w)
                if ended is not None and ended.path and reason in RAN_TO_END:
                    self._tell_path(w, ended)
            case _:
                raise TypeError(f"KVManagerActor cannot handle {type(msg).__name__}")

    def _request_forecast(self, w: str, view: _WorkflowView, hidden: np.ndarray | None) -> None:
        if self.predictor is None or self._nursery is None:
            return
        request_step = view.step
        send, receive = trio.open_memory_channel[np.ndarray | None](1)
        request = ForecastRequest(
            w,
            view.app,
            tuple(view.path),
            view.task_text,
            hidden,
            send,
            view.context_tail,
            view.tenant,
        )
        self._nursery.start_soon(self._await_forecast, w, request_step, request, receive)

    async def _await_forecast(
        self, w: str, step: int, request: ForecastRequest, receive: trio.MemoryReceiveChannel
    ) -> None:
        assert self.predictor is not None
        await self.predictor.tell(request)
        forecast = await receive.receive()
        view = self._workflows.get(w)
        if forecast is None or view is None or view.step != step:
            self.forecasts_stale += 1
            return
        self.kv.on_forecast(w, forecast.probabilities, forecast.agents)
        self.forecasts_applied += 1

    def _tell_path(self, workflow_id: str, view: _WorkflowView) -> None:
        """Hand an ended workflow's path to the predictor (online learning); dropped and
        counted when its mailbox is full, so the KV manager never waits on it."""
        if self.predictor is None:
            return
        try:
            told = self.predictor.try_tell(
                PathObserved(view.app, tuple(view.path), view.tenant, workflow_id)
            )
        except ActorStopped:
            told = False
        if not told:
            self.paths_dropped += 1
