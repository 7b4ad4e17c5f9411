"""The Responses API (``POST /v1/responses``) over the chat path: text and function tools.

Plain code, no trio. A request's ``instructions`` and ``input`` items become chat
messages (:func:`chat_view`): ``message`` items by role, ``function_call`` items the
assistant's ``tool_calls`` (joined to the assistant message before them, as the reply
that made them was one message), ``function_call_output`` items ``tool`` messages, so a
conversation renders as the chat path renders it and stays a token-exact prefix of the
next call. Function tools, ``tool_choice`` and ``text.format`` map to their chat forms;
the reply's content and tool calls become ``message`` and ``function_call`` output items
(:class:`ResponseBuilder`), streamed as the Responses events openai-python reads
(``response.created`` ... ``response.completed``). Not served, refused naming the field:
``previous_response_id`` / ``conversation`` (nothing is stored), tools other than
functions, non-text input parts. Mirrors openai-python's ``types.responses``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from pbkv.server.errors import APIError
from pbkv.server.schemas import (
    MaxTokens,
    Temperature,
    TopP,
    Usage,
    WorkflowHints,
)
from pbkv.server.toolparsers import ParsedCall


class ResponsesRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/responses``; the properties give the chat path's names."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool = False
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    cache_salt: Annotated[str, Meta(max_length=256)] | None = None
    pbkv: WorkflowHints | None = None

    @property
    def n(self) -> int:
        return 1

    @property
    def max_tokens(self) -> int | None:
        return self.max_output_tokens

    @property
    def seed(self) -> None:
        return None

    @property
    def stop(self) -> None:
        return None

    @property
    def stream_options(self) -> None:
        return None


RESPONSES_DECODER = msgspec.json.Decoder(ResponsesRequest)


@dataclass(frozen=True, slots=True)
class ChatView:
    """A Responses request in chat terms."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: str | dict[str, Any] | None
    response_format: dict[str, Any] | None


def _text(content: Any, param: str) -> str:
    """Return a message item's content as text (a string, or text parts joined).

    Raises:
        APIError: 400 naming the first part that is not text.
    """
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("input_text", "output_text", "text"):
            raise APIError(
                400,
                f"{param}[{j}].type: only text parts are served, got {kind!r}",
                param=f"{param}[{j}].type",
                code="unsupported_parameter",
            )
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    """Return the request's instructions and input as chat messages.

    Raises:
        APIError: 400 naming an input item of an unserved type, or malformed.
    """
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        return [*messages, {"role": "user", "content": request.input}]
    for i, item in enumerate(request.input):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"input[{i}].role: got {role!r}", param=f"input[{i}].role")
            text = _text(item.get("content"), f"input[{i}].content")
            messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id", "")),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            if not isinstance(call["function"]["name"], str):
                raise APIError(400, f"input[{i}].name: a string", param=f"input[{i}].name")
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"input[{i}].output")
            messages.append(
                {"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text}
            )
        elif kind != "reasoning":  # a reasoning item carries nothing this model reads
            raise APIError(
                400,
                f"input[{i}].type: {kind!r} items are not served",
                param=f"input[{i}].type",
                code="unsupported_parameter",
            )
    if not messages:
        raise APIError(400, "input: at least one message is required", param="input")
    return messages


def _tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Return Responses function tools in their chat form.

    Raises:
        APIError: 400 naming the first tool that is not a function.
    """
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(
                400,
                f"tools[{i}].type: only function tools are served, got {tool.get('type')!r}",
                param=f"tools[{i}].type",
                code="unsupported_parameter",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: str | Mapping[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice if choice is None or isinstance(choice, str) else dict(choice)


def _response_format(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    form = (text or {}).get("format")
    if not isinstance(form, Mapping) or form.get("type", "text") == "text":
        return None
    if form.get("type") == "json_schema":
        spec = {"name": form.get("name", "response"), "schema": form.get("schema")}
        return {"type": "json_schema", "json_schema": spec}
    return dict(form)


def chat_view(request: ResponsesRequest) -> ChatView:
    """Return ``request`` in chat terms.

    Raises:
        APIError: 400 naming the field for what is not served.
    """
    for name in ("previous_response_id", "conversation"):
        if getattr(request, name):
            raise APIError(
                400,
                f"{name}: responses are not stored; send the whole input",
                param=name,
                code="unsupported_parameter",
            )
    return ChatView(
        _messages(request),
        _tools(request.tools),
        _tool_choice(request.tool_choice),
        _response_format(request.text),
    )


# Replies


class OutputText(msgspec.Struct, frozen=True):
    text: str
    type: str = "output_text"
    annotations: list[Any] = msgspec.field(default_factory=list)


class MessageItem(msgspec.Struct, frozen=True):
    id: str
    content: list[OutputText]
    status: str = "completed"
    role: str = "assistant"
    type: str = "message"


class FunctionCallItem(msgspec.Struct, frozen=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"
    type: str = "function_call"


class InputTokensDetails(msgspec.Struct, frozen=True):
    cached_tokens: int


class OutputTokensDetails(msgspec.Struct, frozen=True):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct, frozen=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct, frozen=True):
    reason: str


class Response(msgspec.Struct, frozen=True):
    """openai-python's ``Response``: the fields its parser and the Agents SDK read."""

    id: str
    created_at: int
    model: str
    output: list[MessageItem | FunctionCallItem]
    status: str
    usage: ResponseUsage | None
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    instructions: str | None
    temperature: float | None
    top_p: float | None
    max_output_tokens: int | None
    incomplete_details: IncompleteDetails | None = None
    error: None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    text: dict[str, Any] = msgspec.field(default_factory=lambda: {"format": {"type": "text"}})
    object: str = "response"


def response_usage(usage: Usage) -> ResponseUsage:
    """Return a chat completion's usage in the Responses API's names."""
    return ResponseUsage(
        usage.prompt_tokens,
        InputTokensDetails(usage.prompt_tokens_details.cached_tokens),
        usage.completion_tokens,
        OutputTokensDetails(),
        usage.total_tokens,
    )


class ResponseBuilder:
    """Builds one response: whole, or as the stream of events that makes it.

    Args:
        request: the request (echoed: tools, tool choice, sampling).
        model: the served model name.
    """

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self._request = request
        self._model = model
        self.id = f"resp_{secrets.token_hex(12)}"
        self._created = int(time.time())
        self._items: list[MessageItem | FunctionCallItem] = []
        self._text: str | None = None  # the open message item's text (streaming)
        self._sequence = 0
        self.calls = 0

    def response(self, status: str, usage: ResponseUsage | None = None) -> Response:
        """Return the response as it stands (``completed``, ``incomplete``, ``in_progress``)."""
        request = self._request
        incomplete = IncompleteDetails("max_output_tokens") if status == "incomplete" else None
        return Response(
            self.id,
            self._created,
            self._model,
            list(self._items),
            status,
            usage,
            list(request.tools or []),
            request.tool_choice or "auto",
            request.parallel_tool_calls is not False,
            request.instructions,
            request.temperature,
            request.top_p,
            request.max_output_tokens,
            incomplete,
            text=request.text or {"format": {"type": "text"}},
        )

    def whole(
        self, content: str | None, calls: Sequence[ParsedCall], finish: str, usage: ResponseUsage
    ) -> Response:
        """Return the whole response of a reply's content and tool calls."""
        if content:
            self._items.append(MessageItem(f"msg_{secrets.token_hex(12)}", [OutputText(content)]))
        for call in calls:
            self._items.append(self._call_item(call))
        return self.response("incomplete" if finish == "length" else "completed", usage)

    def _call_item(self, call: ParsedCall) -> FunctionCallItem:
        self.calls += 1
        return FunctionCallItem(
            f"fc_{secrets.token_hex(12)}",
            f"call_{secrets.token_hex(12)}",
            call.name,
            call.arguments,
        )

    def _event(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        self._sequence += 1
        return kind, {"type": kind, "sequence_number": self._sequence - 1, **fields}

    def opening(self) -> list[tuple[str, dict[str, Any]]]:
        """Return the events that open the stream."""
        started = msgspec.to_builtins(self.response("in_progress"))
        return [
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
        ]

    def pieces(self, pieces: Sequence[str | ParsedCall]) -> list[tuple[str, dict[str, Any]]]:
        """Return the events of parsed pieces: text deltas, and each call whole."""
        events: list[tuple[str, dict[str, Any]]] = []
        for piece in pieces:
            if isinstance(piece, ParsedCall):
                events += self._close_message()
                events += self._call_events(self._call_item(piece))
            elif piece:
                if self._text is None:
                    events += self._open_message()
                self._text = (self._text or "") + piece
                events.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=self._message_id,
                        output_index=len(self._items),
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
                )
        return events

    def _open_message(self) -> list[tuple[str, dict[str, Any]]]:
        self._message_id = f"msg_{secrets.token_hex(12)}"
        self._text = ""
        item = {**msgspec.to_builtins(MessageItem(self._message_id, [])), "status": "in_progress"}
        index = len(self._items)
        part = msgspec.to_builtins(OutputText(""))
        return [
            self._event("response.output_item.added", output_index=index, item=item),
            self._event(
                "response.content_part.added",
                item_id=self._message_id,
                output_index=index,
                content_index=0,
                part=part,
            ),
        ]

    def _close_message(self) -> list[tuple[str, dict[str, Any]]]:
        if self._text is None:
            return []
        text, self._text = self._text, None
        item = MessageItem(self._message_id, [OutputText(text)])
        index = len(self._items)
        self._items.append(item)
        where = {"item_id": item.id, "output_index": index, "content_index": 0}
        return [
            self._event("response.output_text.done", **where, text=text, logprobs=[]),
            self._event(
                "response.content_part.done", **where, part=msgspec.to_builtins(item.content[0])
            ),
            self._event(
                "response.output_item.done", output_index=index, item=msgspec.to_builtins(item)
            ),
        ]

    def _call_events(self, item: FunctionCallItem) -> list[tuple[str, dict[str, Any]]]:
        index = len(self._items)
        self._items.append(item)
        opened = {**msgspec.to_builtins(item), "arguments": "", "status": "in_progress"}
        where = {"item_id": item.id, "output_index": index}
        return [
            self._event("response.output_item.added", output_index=index, item=opened),
            self._event("response.function_call_arguments.delta", **where, delta=item.arguments),
            self._event(
                "response.function_call_arguments.done",
                **where,
                name=item.name,
                arguments=item.arguments,
            ),
            self._event(
                "response.output_item.done", output_index=index, item=msgspec.to_builtins(item)
            ),
        ]

    def closing(self, finish: str, usage: ResponseUsage) -> list[tuple[str, dict[str, Any]]]:
        """Return the events that end the stream: the open message's end, then
        ``response.completed`` (``response.incomplete`` at ``max_output_tokens``)."""
        events = self._close_message()
        status = "incomplete" if finish == "length" else "completed"
        done = msgspec.to_builtins(self.response(status, usage))
        return [*events, self._event(f"response.{status}", response=done)]
