"""One call of a workflow session: the in-flight stream, what it yields, how it fails.

:class:`ReplyStream` submits a call (the ``AgentInvoked`` event, then the agent's
``Invoke``), yields :class:`Delta` s as tokens arrive, and on completion emits
``PrefillDone`` and ``AgentFinished`` (§4) and keeps the :class:`Reply`. A call refused
for room raises :class:`Overloaded`; one the engine fails raises :class:`CallFailed`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from pbkv.actors.events import (
    AgentFinished,
    AgentInvoked,
    CancelInvocation,
    InvocationDone,
    Invoke,
    PrefillDone,
)
from pbkv.actors.workload import Segment
from pbkv.engines.base import EngineError, GenerateResult, Sampling
from pbkv.live.chat import IncrementalDecoder
from pbkv.runtime import ActorRef, ActorStopped, now_s

if TYPE_CHECKING:
    from pbkv.live.session import Runtime
    from pbkv.live.workflow import WorkflowSession


class Overloaded(RuntimeError):
    """More calls are in flight than the runtime admits; retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CallFailed(EngineError):
    """The engine failed a call; ``step`` is the step to pass back when retrying it, and
    ``retryable`` false when retrying cannot help (the request never fits the GPU tier)."""

    def __init__(self, message: str, step: int, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.step = step
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class Reply:
    """What one call produced and what it cost.

    Attributes:
        agent / step: who answered, at which step of the workflow.
        text: the reply without its end-of-turn marker; ``token_ids`` all output ids.
        prompt_tokens: prompt length; ``cached_gpu_tokens`` / ``cached_host_tokens``
            served from each tier; ``computed_tokens`` prefilled.
        ttft_s / latency_s: submit to first token / to last token (runtime clock).
        finish_reason: ``stop`` (end-of-turn or a stop token) or ``length``.
    """

    agent: str
    step: int
    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    cached_gpu_tokens: int
    cached_host_tokens: int
    computed_tokens: int
    ttft_s: float
    latency_s: float
    finish_reason: str
    result: GenerateResult | None = None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from cache (GPU + host), as OpenAI's ``cached_tokens``."""
        return self.cached_gpu_tokens + self.cached_host_tokens


@dataclass(frozen=True, slots=True)
class Delta:
    """A streamed piece of a reply: new token ids and the text they complete."""

    token_ids: tuple[int, ...]
    text: str


class ReplyStream:
    """An in-flight call: iterate it for :class:`Delta` s (see :meth:`WorkflowSession.stream`).

    Attributes:
        reply: the whole :class:`Reply`, once the stream is exhausted.
    """

    def __init__(
        self,
        session: WorkflowSession,
        agent: str,
        segments: tuple[Segment, ...],
        scripted: tuple[int, ...],
        max_new_tokens: int,
        sampling: Sampling,
        gap_s: float,
        context_tail: str,
        streaming: bool,
        step: int | None = None,
        until: Callable[[int], bool] | None = None,
    ) -> None:
        self.session = session
        self.agent = agent
        self.segments = segments
        self.scripted = scripted
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.gap_s = gap_s
        self.context_tail = context_tail
        self.streaming = streaming
        self.until = until
        self.reply: Reply | None = None
        self.step = -1
        self._retry_step = step
        self._tokens, self._receive = trio.open_memory_channel[int | InvocationDone](math.inf)
        self._decoder = IncrementalDecoder(session.runtime.chat.decode)
        self._invocation = ""
        self._agent_ref: ActorRef | None = None
        self._submitted = False
        self._finished = False
        self._text = ""
        self._text_ended = False
        self._until_error: Exception | None = None

    async def __aenter__(self) -> ReplyStream:
        rt = self.session.runtime
        if rt.calls_in_flight >= rt.max_calls_in_flight:
            raise Overloaded(
                f"{rt.calls_in_flight} calls in flight (limit {rt.max_calls_in_flight})"
            )
        if self.gap_s > 0:
            await trio.sleep(self.gap_s)
        rt.calls_in_flight += 1
        try:
            await self._submit()
        except BaseException:
            self._withdraw()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._withdraw()
        self._receive.close()

    def _withdraw(self) -> None:
        """Stop counting the call; cancel its request if the engine may still run it."""
        if self._finished:
            return
        self._finished = True
        self.session.runtime.calls_in_flight -= 1
        if self._submitted and self._agent_ref is not None:
            with contextlib.suppress(ActorStopped):  # it answered and was stopped as idle
                self._agent_ref.try_tell(CancelInvocation(self._invocation))

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> Delta:
        if self._finished:
            raise StopAsyncIteration
        tokens: list[int] = []
        item = await self._receive.receive()
        while True:
            if isinstance(item, InvocationDone):
                await self._done(item)
                if tokens:
                    return self._delta(tokens)
                raise StopAsyncIteration
            tokens.append(item)
            try:
                item = self._receive.receive_nowait()
            except trio.WouldBlock:
                return self._delta(tokens)

    def _delta(self, tokens: list[int]) -> Delta:
        """Return ``tokens`` as a delta; text stops at the end-of-turn marker."""
        text = "".join(self._decoder.push(t) for t in tokens)
        if self._text_ended:
            return Delta(tuple(tokens), "")
        stop = self.session.runtime.chat.stop_text
        self._text += text
        cut = self._text.find(stop)
        if cut >= 0:
            self._text_ended = True
            text = text[: max(0, len(text) - (len(self._text) - cut))]
        return Delta(tuple(tokens), text)

    async def _submit(self) -> None:
        session, rt = self.session, self.session.runtime
        self.step = next(session._steps) if self._retry_step is None else self._retry_step
        session._agents.setdefault(self.agent, None)
        # unique per call: two calls given one ``step`` (retries at once) are cancelled apart
        self._invocation = f"{session.workflow_id}/{self.step}#{next(session._calls)}"
        self._agent_ref = await rt._agent(self.agent)
        try:
            await self._invoke(session, rt, self._agent_ref)
        finally:
            rt._handed(self.agent)
        self._submitted = True

    async def _invoke(self, session: WorkflowSession, rt: Runtime, agent: ActorRef) -> None:
        """Tell the KV manager the agent is invoked, then hand the agent the invocation."""
        await rt._kv_manager.tell(
            AgentInvoked(
                session.workflow_id,
                self.step,
                self.agent,
                [len(s.token_ids) for s in self.segments],
                now_s(),
                self.context_tail,
            )
        )
        send = self._tokens
        on_token = self._on_token if self.streaming or self.until is not None else None
        await agent.tell(
            Invoke(
                session.workflow_id,
                self.step,
                self.agent,
                [s.token_ids for s in self.segments],
                self.scripted,
                session.tenant,
                reply_to=send,
                fixed_prefix_tokens=sum(
                    len(s.token_ids) for s in self.segments if s.kind != "context"
                ),
                max_new_tokens=self.max_new_tokens,
                sampling=self.sampling,
                on_token=on_token,
                invocation_id=self._invocation,
            )
        )

    def _on_token(self, token: int) -> bool:
        """Forward a streamed token; one the engine emits after the caller left is dropped.
        Return whether ``until`` ends the reply at this token.

        The engine calls this in its step loop, where raising would fail every request
        it runs: an exception ``until`` raises ends this reply at this token instead,
        and :meth:`_done` raises it to this call's caller alone.
        """
        if self.streaming:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                self._tokens.send_nowait(token)
        if self.until is None:
            return False
        try:
            return bool(self.until(token))
        except Exception as error:
            self._until_error = error
            return True

    async def _done(self, done: InvocationDone) -> None:
        self._finished = True
        session, rt = self.session, self.session.runtime
        rt.calls_in_flight -= 1
        if self._until_error is not None:
            raise self._until_error
        if done.error is not None:
            raise CallFailed(
                f"{self.agent} (step {self.step}): {done.error}",
                self.step,
                retryable=done.retryable,
            )
        result: GenerateResult = done.result
        at = now_s()
        hidden = None if result.hidden is None else result.hidden.tolist()
        await rt._kv_manager.tell(
            PrefillDone(
                session.workflow_id,
                self.step,
                result.cached_gpu_tokens,
                result.cached_host_tokens,
                result.computed_tokens,
                hidden,
                at,
            )
        )
        output = result.output_token_ids
        await rt._kv_manager.tell(
            AgentFinished(
                session.workflow_id,
                self.step,
                self.agent,
                len(output),
                result.e2e_s,
                at,
                result.ttft_s,
            )
        )
        text = rt.chat.reply_text(output)
        stopped = len(output) < self.max_new_tokens or text != rt.chat.decode(output)
        self.reply = Reply(
            agent=self.agent,
            step=self.step,
            text=text,
            token_ids=output,
            prompt_tokens=result.prompt_tokens,
            cached_gpu_tokens=result.cached_gpu_tokens,
            cached_host_tokens=result.cached_host_tokens,
            computed_tokens=result.computed_tokens,
            ttft_s=result.ttft_s,
            latency_s=result.e2e_s,
            finish_reason="stop" if stopped else "length",
            result=result,
        )
        session.replies.append(self.reply)
