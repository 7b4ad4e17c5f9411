"""The OpenAI-compatible request and response records of ``pbkv serve``.

Requests are decoded once, by one typed decoder per endpoint, into frozen msgspec Structs:
a field of the wrong type or out of range fails there with the JSON path of the field
(``$.messages[0].content``). Unknown fields are tolerated, as OpenAI-compatible servers
do (vendor extensions), and the known ones pbkv does not serve (the legacy
``functions``, ``logprobs``, penalties, ``logit_bias``, audio, ``echo``, ``best_of``,
``suffix``, non-text parts) are read so that asking for them is a 400 naming the field
rather than a reply that silently ignores them. Mirrors
the openai-python types
(``ChatCompletion``, ``ChatCompletionChunk``, ``Completion``, ``Model``) and vLLM's
``cache_salt``; the ``pbkv`` body object carries workflow hints (§7.4).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
MaxTokens = Annotated[int, Meta(ge=1)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]  # int64: msgspec bounds stop there
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]


class TextPart(msgspec.Struct, frozen=True):
    """One part of a multi-part message content; only ``type: "text"`` is served (an
    image or audio part is a 400 naming it, never served as empty text)."""

    type: str
    text: str = ""


class FunctionCall(msgspec.Struct, frozen=True):
    """A called function: its name and its arguments as JSON text."""

    name: str
    arguments: str = "{}"


class ToolCall(msgspec.Struct, frozen=True):
    """One tool call, in an assistant message of the history and in a reply."""

    id: str
    function: FunctionCall
    type: str = "function"


class ChatMessage(msgspec.Struct, frozen=True):
    """One chat message: ``content`` is a string, a list of text parts, or null; an
    assistant message may carry ``tool_calls``, a ``tool`` message its ``tool_call_id``."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """Return the content as one string (text parts joined; null → empty)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(msgspec.Struct, frozen=True):
    include_usage: bool = False


MAX_HINT_CHARS = 256
"""The longest workflow id or agent name a request may give, in the body or a header."""

HintText = Annotated[str, Meta(min_length=1, max_length=MAX_HINT_CHARS)]


class WorkflowHints(msgspec.Struct, frozen=True):
    """The ``pbkv`` body object (sent through OpenAI clients' ``extra_body``); a field
    left out (``None``) leaves the header's hint, if any."""

    workflow_id: HintText | None = None
    agent: HintText | None = None
    final: bool | None = None


class _Sampled(msgspec.Struct, frozen=True, kw_only=True):
    """Fields shared by chat and text completion requests."""

    model: str
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, Meta(ge=1)] = 1
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    cache_salt: Annotated[str, Meta(max_length=256)] | None = None
    pbkv: WorkflowHints | None = None
    # read only to refuse what is not served (see server.generation.refuse_unserved)
    logprobs: bool | Annotated[int, Meta(ge=0)] | None = None
    top_logprobs: Annotated[int, Meta(ge=0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None


class ChatCompletionRequest(_Sampled, frozen=True, kw_only=True):
    """``POST /v1/chat/completions``; ``max_completion_tokens`` wins over ``max_tokens``."""

    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: MaxTokens | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None  # the legacy form of tools
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None


class CompletionRequest(_Sampled, frozen=True, kw_only=True):
    """``POST /v1/completions``: one prompt string (token-id and batch prompts are refused)."""

    prompt: str | list[str]
    echo: bool = False
    best_of: Annotated[int, Meta(ge=1)] | None = None
    suffix: str | None = None


class WorkflowEndRequest(msgspec.Struct, frozen=True):
    """``POST /v1/pbkv/workflows/{id}/end``: the body (optional) names the workflow's
    ``cache_salt`` when it has one."""

    cache_salt: Annotated[str, Meta(max_length=256)] | None = None


CHAT_DECODER = msgspec.json.Decoder(ChatCompletionRequest)
WORKFLOW_END_DECODER = msgspec.json.Decoder(WorkflowEndRequest)
COMPLETION_DECODER = msgspec.json.Decoder(CompletionRequest)


class PromptTokensDetails(msgspec.Struct, frozen=True):
    cached_tokens: int


class Usage(msgspec.Struct, frozen=True):
    """Token counts of one completion; ``cached_tokens`` = prompt tokens served from cache."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(msgspec.Struct, frozen=True):
    """A reply: ``content`` is null when the reply is only tool calls."""

    content: str | None
    role: str = "assistant"
    tool_calls: list[ToolCall] | None = None


class ChatChoice(msgspec.Struct, frozen=True):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


class ChatCompletion(msgspec.Struct, frozen=True):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"


class ToolCallDelta(msgspec.Struct, frozen=True, omit_defaults=True):
    """A streamed tool call: ``index`` says which; pbkv sends each call whole, once."""

    index: int
    id: str | None = None
    function: FunctionCall | None = None
    type: str | None = None


class ChunkDelta(msgspec.Struct, frozen=True, omit_defaults=True):
    content: str | None = None
    role: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct, frozen=True):
    index: int
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct, frozen=True):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    object: str = "chat.completion.chunk"


class TextChoice(msgspec.Struct, frozen=True):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class Completion(msgspec.Struct, frozen=True):
    """A text completion, and (with ``finish_reason`` null) one of its stream chunks."""

    id: str
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None
    object: str = "text_completion"


class ModelCard(msgspec.Struct, frozen=True):
    id: str
    created: int
    owned_by: str = "pbkv"
    object: str = "model"


class ModelList(msgspec.Struct, frozen=True):
    data: list[ModelCard]
    object: str = "list"


class ErrorDetail(msgspec.Struct, frozen=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct, frozen=True):
    """OpenAI's error envelope: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail


def encode(record: Any) -> bytes:
    """Return ``record`` as JSON bytes."""
    return _ENCODER.encode(record)


_ENCODER = msgspec.json.Encoder()
