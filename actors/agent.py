"""AgentActor: builds an invocation's prompt and submits it to the engine (§4)."""

from __future__ import annotations

import itertools

import trio

from pbkv.actors.events import InvocationDone, Invoke
from pbkv.engines.base import Engine, GenerateRequest
from pbkv.runtime import Actor, TaskStatus


class AgentActor(Actor):
    """One agent of an app, serving invocations from every workflow concurrently.

    Each ``Invoke`` runs as its own task, so a long generation never blocks the
    agent's mailbox; the result (or the engine's error) goes back to the workflow
    actor as :class:`InvocationDone`.

    Args:
        agent: the agent's name.
        engine: the engine to generate with.
    """

    def __init__(self, agent: str, engine: Engine, *, mailbox_capacity: int = 1024) -> None:
        super().__init__(mailbox_capacity=mailbox_capacity)
        self.agent = agent
        self.engine = engine
        self._ids = itertools.count()
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await super().run(task_status=task_status)

    async def handle(self, msg: object) -> None:
        match msg:
            case Invoke():
                assert self._nursery is not None
                self._nursery.start_soon(self._generate, msg)
            case _:
                raise TypeError(f"AgentActor cannot handle {type(msg).__name__}")

    async def _generate(self, msg: Invoke) -> None:
        prompt = tuple(t for segment in msg.segments for t in segment)
        request = GenerateRequest(
            request_id=f"{msg.workflow_id}/{msg.step}/{next(self._ids)}",
            workflow_id=msg.workflow_id,
            agent=self.agent,
            prompt_token_ids=prompt,
            max_new_tokens=max(1, len(msg.output_token_ids)),
            segment_lengths=tuple(len(s) for s in msg.segments),
            scripted_output_token_ids=msg.output_token_ids,
            namespace=msg.tenant,
            fixed_prefix_tokens=msg.fixed_prefix_tokens,
        )
        try:
            result = await self.engine.generate(request)
        except Exception as exc:  # the workflow decides: retry or abort (§10)
            await msg.reply_to.tell(InvocationDone(msg.step, error=f"{type(exc).__name__}: {exc}"))
            return
        await msg.reply_to.tell(InvocationDone(msg.step, result=result))
