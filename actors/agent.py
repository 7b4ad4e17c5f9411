"""AgentActor: builds an invocation's prompt and submits it to the engine (§4)."""

from __future__ import annotations

import contextlib
import itertools
import logging

import trio

from pbkv.actors.events import CancelInvocation, InvocationDone, Invoke
from pbkv.engines.base import GREEDY, Engine, GenerateRequest
from pbkv.runtime import Actor, ActorStopped, TaskStatus

log = logging.getLogger(__name__)


class AgentActor(Actor):
    """One agent of an app, serving invocations from every workflow concurrently.

    Each ``Invoke`` runs as its own task under its own cancel scope, so a long
    generation never blocks the agent's mailbox and a :class:`CancelInvocation` (a live
    caller that was cancelled) withdraws exactly that request from the engine. The
    result, or the engine's error, goes back to ``reply_to`` as :class:`InvocationDone`.

    A fault while handling one invocation (a malformed ``Invoke``, a request that cannot
    be built) answers that invocation with the error (not retryable) and is logged; it
    never escapes to the supervisor, whose restart would cancel every other invocation.

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
        self._in_flight: dict[str, trio.CancelScope] = {}
        self.cancelled = 0
        self.running = 0  # invocations handed to the engine and not yet answered

    async def run(self, *, task_status: TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await super().run(task_status=task_status)
            finally:
                self._fail_running(nursery)

    async def on_restart(self, error: Exception) -> None:
        self._in_flight.clear()

    @property
    def idle(self) -> bool:
        """Whether nothing is running or waiting in the mailbox (it may be stopped)."""
        return self.running == 0 and self.statistics().mailbox_depth == 0

    async def handle(self, msg: object) -> None:
        match msg:
            case Invoke():
                try:
                    self._start(msg)
                except Exception as error:
                    await _reply(msg.reply_to, self._faulted(msg, error))
            case CancelInvocation(invocation_id=invocation):
                scope = self._in_flight.pop(invocation, None)
                if scope is not None:
                    self.cancelled += 1
                    scope.cancel()
            case _:
                raise TypeError(f"AgentActor cannot handle {type(msg).__name__}")

    def _start(self, msg: Invoke) -> None:
        """Run ``msg`` in its own task under its own cancel scope."""
        assert self._nursery is not None
        scope = trio.CancelScope()
        if msg.invocation_id:
            self._in_flight[msg.invocation_id] = scope
        self.running += 1
        self._nursery.start_soon(self._generate, msg, scope)

    def _faulted(self, msg: Invoke, error: Exception) -> InvocationDone:
        """Log a fault in handling ``msg`` and return its answer (not retryable)."""
        invocation = msg.invocation_id
        log.error("agent %s: invocation %r failed", self.agent, invocation, exc_info=error)
        return InvocationDone(
            msg.step, error=f"agent {self.agent}: {type(error).__name__}: {error}", retryable=False
        )

    def _fail_running(self, nursery: trio.Nursery) -> None:
        """Cancel what still runs when the actor stops or fails: callers see the error."""
        self._in_flight.clear()
        nursery.cancel_scope.cancel()

    async def _generate(self, msg: Invoke, scope: trio.CancelScope) -> None:
        """Generate ``msg``'s reply and send it; whatever happens, it is answered."""
        done: InvocationDone | None = None
        try:
            with scope:
                done = await self._outcome(msg)
        finally:
            self._in_flight.pop(msg.invocation_id, None)
            self.running -= 1
            if done is None:  # cancelled: by CancelInvocation or because the actor stops
                done = InvocationDone(msg.step, error=f"agent {self.agent}: invocation cancelled")
            with trio.CancelScope(shield=True):
                await _reply(msg.reply_to, done)

    async def _outcome(self, msg: Invoke) -> InvocationDone:
        """Return ``msg``'s engine result, or its error (only cancellation escapes)."""
        try:
            request = self._request(msg)
        except Exception as error:
            return self._faulted(msg, error)
        try:
            result = await self.engine.generate(request)
        except Exception as exc:  # the workflow decides: retry or abort (§10)
            retryable = bool(getattr(exc, "retryable", True))
            return InvocationDone(
                msg.step, error=f"{type(exc).__name__}: {exc}", retryable=retryable
            )
        return InvocationDone(msg.step, result=result)

    def _request(self, msg: Invoke) -> GenerateRequest:
        """Return the engine request of ``msg`` (a fresh request id)."""
        prompt = tuple(itertools.chain.from_iterable(msg.segments))
        return GenerateRequest(
            request_id=f"{msg.workflow_id}/{msg.step}/{next(self._ids)}",
            workflow_id=msg.workflow_id,
            agent=self.agent,
            prompt_token_ids=prompt,
            max_new_tokens=msg.max_new_tokens or max(1, len(msg.output_token_ids)),
            segment_lengths=tuple(len(s) for s in msg.segments),
            scripted_output_token_ids=msg.output_token_ids,
            namespace=msg.tenant,
            fixed_prefix_tokens=msg.fixed_prefix_tokens,
            sampling=msg.sampling or GREEDY,
            on_token=msg.on_token,
        )


async def _reply(reply_to: object, done: InvocationDone) -> None:
    """Send ``done`` to a workflow actor's ref or a live session's one-shot channel
    (``None``: nobody asked for it)."""
    if reply_to is None:
        return
    if isinstance(reply_to, trio.MemorySendChannel):
        # the caller is gone (cancelled) or already answered: nobody waits for this reply
        gone = (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError)
        with contextlib.suppress(*gone):
            reply_to.send_nowait(done)
        return
    with contextlib.suppress(ActorStopped):  # the workflow actor stopped meanwhile
        await reply_to.tell(done)  # type: ignore[attr-defined]
