"""WorkflowActor: walks one workflow through its agents and reports its lifecycle (§4)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio

from pbkv.actors.events import (
    AgentFinished,
    AgentInvoked,
    InvocationDone,
    Invoke,
    PrefillDone,
    StartWorkflow,
    TerminationReason,
    WorkflowStarted,
    WorkflowTerminated,
)
from pbkv.actors.workload import Workflow
from pbkv.engines.base import GenerateResult
from pbkv.runtime import Actor, ActorRef, now_s

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkflowOutcome:
    """How one workflow went: its end reason, timings and per-invocation results.

    ``path`` is the agents it ran, in order; ``error`` what ended it with ``error``.
    """

    workflow_id: str
    reason: TerminationReason
    start_s: float
    end_s: float
    results: tuple[GenerateResult, ...] = field(default=())
    path: tuple[str, ...] = ()
    error: str = ""

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s


class WorkflowActor(Actor):
    """Replay one :class:`Workflow`: its router's path, with tool/think gaps.

    Routing comes from the workflow script (the app's router already chose the path
    from the task's hidden features); the actor issues each invocation after its gap,
    emits the lifecycle events to the KV-manager actor, and retries a failed
    invocation up to ``max_retries`` times before aborting with reason ``error``.

    Args:
        workflow: the script to replay.
        agents: agent name → AgentActor ref.
        kv_manager: the KVManagerActor's ref.
        outcomes: send channel that receives the :class:`WorkflowOutcome`.
        max_retries: retries per failed invocation.
    """

    def __init__(
        self,
        workflow: Workflow,
        agents: dict[str, ActorRef],
        kv_manager: ActorRef,
        outcomes: trio.MemorySendChannel[WorkflowOutcome],
        *,
        max_retries: int = 1,
    ) -> None:
        super().__init__(mailbox_capacity=4)
        missing = {s.agent for s in workflow.steps} - set(agents)
        if missing:
            raise ValueError(
                f"workflow {workflow.workflow_id}: no actor for agents {sorted(missing)}"
            )
        self.workflow = workflow
        self.agents = agents
        self.kv_manager = kv_manager
        self.outcomes = outcomes
        self.max_retries = max_retries
        self._start_s = 0.0
        self._retries = 0
        self._results: list[GenerateResult] = []

    async def handle(self, msg: object) -> None:
        match msg:
            case StartWorkflow():
                await self._start()
            case InvocationDone(step=step, error=None, result=result):
                await self._finished(step, result)
            case InvocationDone(step=step, error=error):
                await self._failed(step, error)
            case _:
                raise TypeError(f"WorkflowActor cannot handle {type(msg).__name__}")

    async def _start(self) -> None:
        wf = self.workflow
        self._start_s = now_s()
        await self.kv_manager.tell(
            WorkflowStarted(
                wf.workflow_id, wf.app, wf.task_id, wf.tenant, self._start_s, wf.task_text
            )
        )
        if wf.steps:
            await self._invoke(0)
        else:
            await self._terminate("end")

    async def _invoke(self, step: int) -> None:
        spec = self.workflow.steps[step]
        if spec.gap_s > 0:
            await trio.sleep(spec.gap_s)
        wf_id = self.workflow.workflow_id
        segments = [len(s.token_ids) for s in spec.segments]
        await self.kv_manager.tell(
            AgentInvoked(wf_id, step, spec.agent, segments, now_s(), spec.context_tail)
        )
        await self.agents[spec.agent].tell(
            Invoke(
                wf_id,
                step,
                spec.agent,
                [s.token_ids for s in spec.segments],
                spec.output_token_ids,
                self.workflow.tenant,
                reply_to=self.ref,
                fixed_prefix_tokens=sum(
                    len(s.token_ids) for s in spec.segments if s.kind != "context"
                ),
            )
        )

    async def _finished(self, step: int, result: GenerateResult) -> None:
        wf_id, agent = self.workflow.workflow_id, self.workflow.steps[step].agent
        hidden = None if result.hidden is None else result.hidden.tolist()
        at = now_s()
        await self.kv_manager.tell(
            PrefillDone(
                wf_id,
                step,
                result.cached_gpu_tokens,
                result.cached_host_tokens,
                result.computed_tokens,
                hidden,
                at,
            )
        )
        await self.kv_manager.tell(
            AgentFinished(
                wf_id, step, agent, len(result.output_token_ids), result.e2e_s, at, result.ttft_s
            )
        )
        self._results.append(result)
        self._retries = 0
        if step + 1 < len(self.workflow.steps):
            await self._invoke(step + 1)
        else:
            await self._terminate(self.workflow.end_reason)  # type: ignore[arg-type]

    async def _failed(self, step: int, error: str | None) -> None:
        log.warning("workflow %s step %d failed: %s", self.workflow.workflow_id, step, error)
        if self._retries < self.max_retries:
            self._retries += 1
            await self._invoke(step)
        else:
            await self._terminate("error")

    async def _terminate(self, reason: TerminationReason) -> None:
        end = now_s()
        await self.kv_manager.tell(WorkflowTerminated(self.workflow.workflow_id, reason, end))
        await self.outcomes.send(
            WorkflowOutcome(
                self.workflow.workflow_id, reason, self._start_s, end, tuple(self._results)
            )
        )
        self.close_mailbox()
