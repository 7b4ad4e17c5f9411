"""A request's prompt → token-id segments, refused by its size before it is tokenized.

Tokenizing holds a CPU for about a second per MiB of text (SmolLM2's tokenizer), so a
large prompt tokenized on the event loop stalls every other request. A prompt is first
checked against what the context window could hold at all, in characters, and refused
without tokenizing past that; one that passes and is larger than :data:`INLINE_CHARS` is
tokenized in a worker thread (the tokenizer releases the GIL: ``pbkv.assets.encode``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from pbkv.server.errors import APIError

MAX_CHARS_PER_TOKEN = 32
"""The most characters one prompt token is counted to hold when bounding a prompt's size
before tokenizing. Text averages about 4 per token, code about 3; SmolLM2's longest
token is 81 characters (a run of spaces), so a prompt averaging more than 32 per token
is padding, refused as if it did not fit."""

INLINE_CHARS = 4096
"""Prompts up to this many characters are tokenized on the event loop (a millisecond or
so); larger ones in a worker thread."""

Prompt = str | Sequence[Mapping[str, Any]]
Tools = Sequence[Mapping[str, Any]]


def _message_chars(message: Mapping[str, Any]) -> int:
    calls = message.get("tool_calls") or ()
    arguments = sum(len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in calls)
    return len(message.get("content") or "") + arguments


def prompt_chars(prompt: Prompt, tools: Tools = ()) -> int:
    """Return the characters of ``prompt``'s text (a string, or messages' contents and
    tool calls) and of the ``tools`` rendered with it."""
    tool_chars = sum(len(json.dumps(t)) for t in tools)
    if isinstance(prompt, str):
        return len(prompt) + tool_chars
    return sum(_message_chars(m) for m in prompt) + tool_chars


def check_size(prompt: Prompt, param: str, context_length_tokens: int, tools: Tools = ()) -> None:
    """Refuse a prompt too long for the context window before it is tokenized.

    Args:
        prompt: the request's prompt string or chat messages.
        param: the request field that holds it (``messages`` or ``prompt``).
        context_length_tokens: the model's context length.
        tools: tool definitions rendered with the messages.

    Raises:
        APIError: 400 ``context_length_exceeded`` naming ``param`` when the prompt has
            more than ``context_length_tokens * MAX_CHARS_PER_TOKEN`` characters.
    """
    chars, most = prompt_chars(prompt, tools), context_length_tokens * MAX_CHARS_PER_TOKEN
    if chars > most:
        raise APIError(
            400,
            f"{param}: {chars} characters is more than this model's context length of "
            f"{context_length_tokens} tokens holds (at most {most} characters, "
            f"{MAX_CHARS_PER_TOKEN} per token); it was not tokenized",
            param=param,
            code="context_length_exceeded",
        )


def _segments(chat: Any, prompt: Prompt, tools: Tools) -> tuple[Any, ...]:
    from pbkv.actors.workload import Segment

    if isinstance(prompt, str):
        return (Segment("context", chat.encode(prompt)),)
    return tuple(chat.segments(prompt, tools=tools, default_system=True))


async def tokenize(chat: Any, prompt: Prompt, tools: Tools = ()) -> tuple[Any, ...]:
    """Return ``prompt`` as segments of token ids (``chat.segments`` for messages, with
    ``tools`` and the template's default system prompt; one ``context`` segment for a
    string), in a worker thread past :data:`INLINE_CHARS`.

    Args:
        chat: the runtime's :class:`pbkv.live.chat.ChatFormat`.
        prompt: a prompt string or chat messages, already size-checked (:func:`check_size`).
        tools: OpenAI tool definitions rendered into the first system message.
    """
    if prompt_chars(prompt, tools) <= INLINE_CHARS:
        return _segments(chat, prompt, tools)
    return await trio.to_thread.run_sync(_segments, chat, prompt, tools)
