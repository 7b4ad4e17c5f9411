"""A live workflow: the session an app opens per task and calls agents through (§4).

A :class:`WorkflowSession` checks each call's arguments at the boundary, turns its
prompt into segments, hands it to a :class:`~pbkv.live.call.ReplyStream`, and on
:meth:`~WorkflowSession.end` tells the KV manager the workflow terminated (its private
cache retires).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, get_args

import trio

from pbkv.actors.events import TerminationReason, WorkflowTerminated
from pbkv.actors.workload import Segment, SegmentKind
from pbkv.engines.base import GREEDY, Sampling
from pbkv.live.call import Reply, ReplyStream
from pbkv.live.simulated import (
    Simulated,
    check_simulated,
    checked_token_ids,
    scripted_floor,
    scripted_output,
)
from pbkv.runtime import ActorStopped, now_s

if TYPE_CHECKING:
    from pbkv.live.session import Runtime


Prompt = Sequence[Mapping[str, Any]] | Sequence[Segment] | str
"""What :meth:`WorkflowSession.call` takes: chat messages, raw segments or raw text."""

END_REASONS: tuple[TerminationReason, ...] = ("end", "aborted", "error", "recursion_limit")


class WorkflowEnded(RuntimeError):
    """A call was made on a workflow session that has already ended."""


class WorkflowSession:
    """One live workflow: its calls, its lifecycle events, its end.

    Made by :meth:`~pbkv.live.session.Runtime.open_workflow`. Calls may run concurrently
    (fan-out in a nursery); each is one step of the workflow.
    """

    def __init__(
        self,
        runtime: Runtime,
        workflow_id: str,
        app: str,
        task_id: str,
        task_text: str,
        tenant: str,
    ) -> None:
        self.runtime = runtime
        self.workflow_id = workflow_id
        self.app = app
        self.task_id = task_id
        self.task_text = task_text
        self.tenant = tenant
        self.replies: list[Reply] = []
        self.reason: TerminationReason | None = None
        self.start_s = now_s()
        self.end_s = math.nan
        self._steps = itertools.count()
        self._calls = itertools.count()  # invocation ids: two calls never share one
        self._agents: dict[str, None] = {}

    @property
    def agents(self) -> tuple[str, ...]:
        """The agents this workflow called, in order of first call."""
        return tuple(self._agents)

    @property
    def ended(self) -> bool:
        return self.reason is not None

    async def call(
        self,
        agent: str,
        prompt: Prompt,
        *,
        max_new_tokens: int = 256,
        sampling: Sampling = GREEDY,
        simulated: Simulated | None = None,
        context_tail: str = "",
        step: int | None = None,
        until: Callable[[int], bool] | None = None,
    ) -> Reply:
        """Call ``agent`` on ``prompt`` and return its reply.

        Args:
            agent: the agent's name (a node of the app's call graph).
            prompt: chat messages (templated message by message), raw ``Segment`` s,
                or raw text (one context segment, for plain completions).
            max_new_tokens: decode budget, >= 1.
            sampling: temperature / top-p / seed (greedy by default).
            simulated: the reply on an engine that samples no text (sim); real engines
                ignore it. Without it the sim emits ``max_new_tokens`` filler tokens.
            context_tail: the newest text in the context, for text-reading predictors.
            step: the step this call repeats (a retry after :class:`CallFailed`, whose
                ``step`` it is); default the workflow's next step.
            until: called with each output token id as the engine produces it (in the
                engine's step loop: it must not block); returning ``True`` ends the reply
                after that token, so a stop sequence ends decoding where it completes
                (``pbkv serve``'s ``stop``). An exception it raises ends the reply there
                too and is raised by this call; other calls run on. Engines that cannot
                end a request early (``trtllm``) never call it.

        Raises:
            ValueError / TypeError: bad arguments (named), checked before anything
                reaches the engine; ``PromptTooLong`` past the context.
            WorkflowEnded: the session has ended.
            Overloaded: too many calls in flight in the runtime.
            CallFailed: the engine failed the request (an ``EngineError``).
            Exception: what ``until`` raised (this call alone fails).
        """
        async with self.stream(
            agent,
            prompt,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            simulated=simulated,
            context_tail=context_tail,
            step=step,
            until=until,
            _stream=False,
        ) as stream:
            async for _ in stream:
                pass
        assert stream.reply is not None
        return stream.reply

    def stream(
        self,
        agent: str,
        prompt: Prompt,
        *,
        max_new_tokens: int = 256,
        sampling: Sampling = GREEDY,
        simulated: Simulated | None = None,
        context_tail: str = "",
        step: int | None = None,
        until: Callable[[int], bool] | None = None,
        _stream: bool = True,
    ) -> ReplyStream:
        """Call ``agent`` and stream its reply: ``async with wf.stream(...) as s``.

        Iterate ``s`` for :class:`Delta` s; ``s.reply`` is set once it is exhausted.
        Leaving the block early, or being cancelled, withdraws the request from the
        engine and releases its cache leases. Arguments and errors as :meth:`call`.
        """
        if self.ended:
            raise WorkflowEnded(f"workflow {self.workflow_id!r} has ended ({self.reason})")
        if not agent or not isinstance(agent, str):
            raise ValueError(f"agent must be a non-empty string, got {agent!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        _check_options(sampling, simulated, context_tail, step, until)
        segments = self._segments(prompt)
        prompt_tokens = sum(len(s.token_ids) for s in segments)
        if prompt_tokens == 0:
            raise ValueError("prompt is empty")
        scripted: tuple[int, ...] = ()
        if not self.runtime.samples_tokens:
            # refuse a reply too long for the context before building it: a client's
            # max_tokens of 2**31 would otherwise be allocated first
            self.runtime.chat.check_fits(prompt_tokens, scripted_floor(simulated, max_new_tokens))
            scripted = scripted_output(self.runtime.chat, simulated, max_new_tokens)
            max_new_tokens = len(scripted)
        self.runtime.chat.check_fits(prompt_tokens, max_new_tokens)
        gap_s = (
            simulated.gap_s * self.runtime.gap_scale
            if simulated is not None and not self.runtime.samples_tokens
            else 0
        )
        return ReplyStream(
            self,
            agent,
            segments,
            scripted,
            max_new_tokens,
            sampling,
            gap_s,
            context_tail,
            _stream,
            step,
            until,
        )

    async def end(self, reason: TerminationReason = "end") -> None:
        """End the workflow: its private cache becomes retired (§4). Idempotent.

        Waits only on a running KV manager (its mailbox's room); once the runtime's KV
        manager has stopped, or was cancelled, the workflow ends at once.

        Raises:
            ValueError: ``reason`` is not one of ``end``, ``aborted``, ``error``,
                ``recursion_limit``.
        """
        if reason not in END_REASONS:
            raise ValueError(f"reason must be one of {END_REASONS}, got {reason!r}")
        if self.ended:
            return
        self.reason = reason
        self.end_s = now_s()
        self.runtime._ended_session(self, reason)
        # a stopped KV manager (the runtime shutting down, or cancelled) retires nothing
        # more: the workflow ends without waiting on it
        with trio.CancelScope(shield=True), contextlib.suppress(ActorStopped):
            await self.runtime._kv_manager.tell(
                WorkflowTerminated(self.workflow_id, reason, self.end_s)
            )

    def _segments(self, prompt: Prompt) -> tuple[Segment, ...]:
        chat = self.runtime.chat
        if isinstance(prompt, str):
            return (Segment("context", chat.encode(prompt)),)
        if not isinstance(prompt, Sequence) or not prompt:
            raise ValueError("prompt must be non-empty messages, segments or text")
        if all(isinstance(p, Segment) for p in prompt):
            return tuple(_checked_segment(i, p) for i, p in enumerate(prompt))
        return chat.segments(prompt)  # type: ignore[arg-type]


_SEGMENT_KINDS: tuple[str, ...] = get_args(SegmentKind)


def _check_options(
    sampling: object, simulated: object, context_tail: object, step: object, until: object
) -> None:
    """Refuse a call's options of the wrong type or range, naming the argument.

    Raises:
        TypeError / ValueError: the first bad one.
    """
    if not isinstance(sampling, Sampling):
        raise TypeError(
            f"sampling must be a pbkv.Sampling (e.g. pbkv.Sampling(temperature=0.7)), "
            f"got {type(sampling).__name__}"
        )
    if simulated is not None:
        check_simulated(simulated)
    if not isinstance(context_tail, str):
        raise TypeError(f"context_tail must be a str, got {type(context_tail).__name__}")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int or None, got {step!r}")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
    if until is not None and not callable(until):
        raise TypeError(f"until must be callable or None, got {type(until).__name__}")


def _checked_segment(index: int, segment: Any) -> Segment:
    """Return a caller's prompt segment with its ids as a tuple of ints, or refuse it."""
    if segment.kind not in _SEGMENT_KINDS:
        raise ValueError(
            f"prompt[{index}].kind must be one of {_SEGMENT_KINDS}, got {segment.kind!r}"
        )
    ids = checked_token_ids(f"prompt[{index}].token_ids", segment.token_ids)
    return segment if ids is segment.token_ids else Segment(segment.kind, ids)
