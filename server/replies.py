"""A :class:`~pbkv.server.generation.Generation` run as one call of a live workflow, and
its reply written: a chat or text completion whole or streamed, or a Responses API reply.

The reply text is cut at the request's stop sequences (:mod:`pbkv.server.stop`); where the
request has tools, tool calls are parsed out of it (:mod:`pbkv.server.toolparsers`) and sent
as ``tool_calls``, streamed each whole as one delta. ``finish_reason`` is OpenAI's. The
lease's workflow call is settled before the last of the reply is written.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from pbkv.server.asgi import Responder
from pbkv.server.failures import failing_until
from pbkv.server.generation import Generation
from pbkv.server.responses import ResponseBuilder, ResponsesRequest, response_usage
from pbkv.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    ChunkDelta,
    Completion,
    FunctionCall,
    PromptTokensDetails,
    TextChoice,
    ToolCall,
    ToolCallDelta,
    Usage,
    encode,
)
from pbkv.server.sessions import Lease
from pbkv.server.stop import StopCutter, StopWatch, streamed_text
from pbkv.server.toolparsers import ParsedCall, make_tool_parser, parse_reply

Headers = list[tuple[bytes, bytes]]


class Replier:
    """Runs generations and writes their replies.

    Args:
        runtime: the open live runtime (its chat format decodes the reply).
        model: the model name replies report.
        tool_call_parser: the parser that reads tool calls out of replies
            (:data:`pbkv.server.toolparsers.TOOL_CALL_PARSERS`).
    """

    def __init__(self, runtime: Any, model: str, tool_call_parser: str) -> None:
        self._runtime = runtime
        self._model = model
        self._tool_call_parser = tool_call_parser

    async def whole(
        self,
        lease: Lease,
        agent: str,
        generation: Generation,
        responder: Responder,
        headers: Headers,
    ) -> None:
        """Serve a chat or text completion as one JSON body."""
        reply = await self._call(lease, agent, generation)
        cutter = StopCutter(generation.stops)
        chat = self._runtime.chat
        text = cutter.feed(streamed_text(reply.token_ids, chat.decode, chat.stop_text))
        text += cutter.flush()
        content: str | None = text
        calls: list[ToolCall] = []
        if generation.plan.parse_calls:
            parsed = parse_reply(make_tool_parser(self._tool_call_parser), text)
            content, calls = parsed.content, [_tool_call(c) for c in parsed.calls]
        finish = self._finish_reason(reply, generation, cutter, len(calls))
        ident, created = _ident(generation.endpoint), int(time.time())
        if generation.endpoint == "chat":
            choice = ChatChoice(0, AssistantMessage(content, tool_calls=calls or None), finish)
            record: Any = ChatCompletion(ident, created, self._model, [choice], _usage(reply))
        else:
            choices = [TextChoice(0, text, finish)]
            record = Completion(ident, created, self._model, choices, _usage(reply))
        await lease.settle()
        await responder.whole(200, encode(record), headers)

    async def stream(
        self,
        lease: Lease,
        agent: str,
        generation: Generation,
        responder: Responder,
        headers: Headers,
    ) -> None:
        """Serve a chat or text completion as server-sent chunks (errors before the first
        token are answered as JSON)."""
        frames = _Frames(generation.endpoint, _ident(generation.endpoint), self._model)
        cutter = StopCutter(generation.stops)
        parser = make_tool_parser(self._tool_call_parser) if generation.plan.parse_calls else None
        async with self._stream_call(lease, agent, generation) as stream:
            async for delta in stream:
                if not responder.started:  # errors before the first token answer as JSON
                    await responder.start_events(headers)
                    await frames.open(responder)
                piece = cutter.feed(delta.text)
                if piece:
                    await frames.send(responder, parser.feed(piece) if parser else [piece])
            reply = stream.reply
        if not responder.started:
            await responder.start_events(headers)
            await frames.open(responder)
        await lease.settle()
        tail = cutter.flush()
        pieces: list[Any] = [tail] if tail else []
        if parser is not None:
            pieces = (parser.feed(tail) if tail else []) + parser.finish()
        await frames.send(responder, pieces)
        finish = self._finish_reason(reply, generation, cutter, frames.calls)
        await responder.event(frames.finish(finish))
        if generation.include_usage:
            await responder.event(frames.usage(_usage(reply)))
        await responder.end_events()

    async def respond(
        self,
        lease: Lease,
        agent: str,
        generation: Generation,
        request: ResponsesRequest,
        responder: Responder,
        headers: Headers,
    ) -> None:
        """Serve a Responses API request, whole or as its stream of events."""
        builder = ResponseBuilder(request, self._model)
        parser = make_tool_parser(self._tool_call_parser)
        parse = generation.plan.parse_calls
        chat = self._runtime.chat
        if not generation.stream:
            reply = await self._call(lease, agent, generation)
            text = streamed_text(reply.token_ids, chat.decode, chat.stop_text)
            parsed = parse_reply(parser, text) if parse else None
            content = parsed.content if parsed else text
            calls = parsed.calls if parsed else ()
            finish = self._finish_reason(reply, generation, StopCutter(), len(calls))
            usage = response_usage(_usage(reply))
            await lease.settle()
            record = builder.whole(content, calls, finish, usage)
            await responder.whole(200, encode(record), headers)
            return

        async def send(events: list[tuple[str, dict[str, Any]]]) -> None:
            for name, event in events:
                await responder.event(msgspec.json.encode(event), name)

        async with self._stream_call(lease, agent, generation) as stream:
            async for delta in stream:
                if not responder.started:
                    await responder.start_events(headers)
                    await send(builder.opening())
                await send(builder.pieces(parser.feed(delta.text) if parse else [delta.text]))
            reply = stream.reply
        if not responder.started:
            await responder.start_events(headers)
            await send(builder.opening())
        await lease.settle()
        await send(builder.pieces(parser.finish() if parse else []))
        finish = self._finish_reason(reply, generation, StopCutter(), builder.calls)
        await send(builder.closing(finish, response_usage(_usage(reply))))
        await responder.end_events()

    async def _call(self, lease: Lease, agent: str, generation: Generation) -> Any:
        """Run ``generation`` as one call of the lease's workflow; return its reply."""
        return await lease.workflow.call(
            agent,
            generation.prompt,
            max_new_tokens=generation.max_new_tokens,
            sampling=generation.sampling,
            until=self._stop_watch(generation),
            simulated=generation.simulated,
        )

    def _stream_call(self, lease: Lease, agent: str, generation: Generation) -> Any:
        """Run ``generation`` as one streamed call (``async with ... as stream``)."""
        return lease.workflow.stream(
            agent,
            generation.prompt,
            max_new_tokens=generation.max_new_tokens,
            sampling=generation.sampling,
            until=self._stop_watch(generation),
            simulated=generation.simulated,
        )

    def _stop_watch(self, generation: Generation) -> Callable[[int], bool] | None:
        """Return what ends decoding at the token completing a stop sequence, if any
        (one that raises :class:`~pbkv.server.failures.InjectedFault` for a request with
        a fault injected)."""
        if generation.inject_fault:
            return failing_until
        watch = StopWatch(generation.stops, self._runtime.chat.decode) if generation.stops else None
        if generation.constraint is not None:
            return _Constrained(generation.constraint, watch)
        return watch

    def _finish_reason(
        self, reply: Any, generation: Generation, cutter: StopCutter, calls: int = 0
    ) -> str:
        """Return OpenAI's ``finish_reason``: ``tool_calls`` when the reply holds tool
        calls, ``stop`` at a stop sequence or the end of turn, ``length`` when the reply
        used up ``max_tokens`` without either.

        The sim engine samples nothing: its reply is filler up to the budget, closed by
        an end-of-turn marker that is part of the filler, so it ends by ``length``; a
        simulated reply (scripted, or a schema-valid one) ends by ``stop``.
        """
        if calls:
            return "tool_calls"
        if cutter.stopped or generation.simulated is not None:
            return "stop"
        if not self._runtime.samples_tokens:
            return "length" if len(reply.token_ids) >= generation.max_new_tokens else "stop"
        return str(reply.finish_reason)


class _Frames:
    """Builds the stream chunks of one chat or text completion."""

    def __init__(self, endpoint: str, ident: str, model: str) -> None:
        self._chat = endpoint == "chat"
        self._ident = ident
        self._model = model
        self._created = int(time.time())
        self.calls = 0  # tool calls sent

    def _chunk(self, choices: list[Any], usage: Usage | None = None) -> Any:
        if self._chat:
            return ChatCompletionChunk(self._ident, self._created, self._model, choices, usage)
        return Completion(self._ident, self._created, self._model, choices, usage)

    async def open(self, responder: Responder) -> None:
        if self._chat:  # OpenAI's first chat chunk carries the role
            delta = ChunkDelta(content="", role="assistant")
            await responder.event(self._chunk([ChunkChoice(0, delta)]))

    async def send(self, responder: Responder, pieces: Sequence[str | ParsedCall]) -> None:
        """Send parsed pieces: content text, and each tool call whole as one delta."""
        for piece in pieces:
            if isinstance(piece, ParsedCall):
                call = _tool_call(piece)
                delta = ToolCallDelta(self.calls, call.id, call.function, "function")
                self.calls += 1
                await responder.event(self._chunk([ChunkChoice(0, ChunkDelta(tool_calls=[delta]))]))
            elif piece:
                await responder.event(self.piece(piece))

    def piece(self, text: str) -> Any:
        if self._chat:
            return self._chunk([ChunkChoice(0, ChunkDelta(content=text))])
        return self._chunk([TextChoice(0, text)])

    def finish(self, reason: str) -> Any:
        if self._chat:
            return self._chunk([ChunkChoice(0, ChunkDelta(), reason)])
        return self._chunk([TextChoice(0, "", reason)])

    def usage(self, usage: Usage) -> Any:
        return self._chunk([], usage)


class _Constrained:
    """The ``until`` of a constrained reply: stop sequences (if any) end it, and its
    ``constraint`` is what the engine masks its logits with
    (:func:`pbkv.engines.constrained.request_constraint`)."""

    def __init__(self, constraint: Any, watch: StopWatch | None) -> None:
        self.constraint = constraint
        self._watch = watch

    def __call__(self, token: int) -> bool:
        return self._watch(token) if self._watch is not None else False


def _usage(reply: Any) -> Usage:
    completion = len(reply.token_ids)
    return Usage(
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=completion,
        total_tokens=reply.prompt_tokens + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=reply.cached_tokens),
    )


def _ident(endpoint: str) -> str:
    prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
    return f"{prefix}-{secrets.token_hex(12)}"


def _tool_call(call: ParsedCall) -> ToolCall:
    """Return a parsed call as a reply's tool call, with a fresh id."""
    return ToolCall(f"call_{secrets.token_hex(12)}", FunctionCall(call.name, call.arguments))
