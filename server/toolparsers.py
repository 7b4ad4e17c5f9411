"""Tool-call parsers: a model's reply text → content and tool calls (``--tool-call-parser``).

Plain code, no trio. A parser reads the text piece by piece, as a stream delivers it, and
hands back :class:`Piece` s: content to show and :class:`ParsedCall` s. A whole reply is
parsed by feeding it in one piece (:func:`parse_reply`), so a streamed reply's pieces
joined are the whole reply's content and calls by construction. Parsers are registered
by name (:data:`TOOL_CALL_PARSERS`), as vLLM's and SGLang's ``--tool-call-parser``.

The ``hermes`` parser (alias ``qwen25``, SGLang's name) reads
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, the format
:mod:`pbkv.live.chat` renders tools in (vLLM: ``hermes_tool_parser.py``): the content is
the text before the first block, without its trailing whitespace; text between and after
blocks is dropped. A block that is not a JSON object with a string ``name`` ends the
parsing: it and everything after it are content, as the model wrote them. A block left
open at the end of the reply (``max_tokens``, or an end of turn instead of the closing
tag) is a call if its text parses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import NamedTuple, Protocol

from pbkv.live.chat import TOOL_CALL_CLOSE, TOOL_CALL_OPEN


class ParsedCall(NamedTuple):
    """One tool call read from a reply: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


Piece = str | ParsedCall
"""What a parser hands back: content text, or one whole tool call."""


class ParsedReply(NamedTuple):
    """A whole reply: its content (``None`` when it is empty and there are calls) and calls."""

    content: str | None
    calls: tuple[ParsedCall, ...]


class ToolCallParser(Protocol):
    """Reads one reply's text piece by piece (a new parser per reply)."""

    def feed(self, text: str) -> list[Piece]:
        """Add ``text``; return the pieces it completes (content may be held back while
        it could still open a tool call)."""
        ...

    def finish(self) -> list[Piece]:
        """End the reply; return the pieces still held."""
        ...


def _call_of(body: str) -> ParsedCall | None:
    """Return the call a block's JSON text describes, or ``None`` when it is none."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # already JSON text (some models write it so)
        return ParsedCall(value["name"], arguments)
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _partial_tag(text: str, tag: str) -> int:
    """Return the length of the longest end of ``text`` that begins ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class HermesParser:
    """Parse ``<tool_call>{json}</tool_call>`` blocks (see the module docstring)."""

    def __init__(self) -> None:
        self._held = ""  # outside a block: text not yet known to be content
        self._block: str | None = None  # inside a block: its text so far
        self._space = ""  # the whitespace before the open block (content if it fails)
        self._calls = 0
        self._raw = False  # a block failed: the rest is content as written

    def feed(self, text: str) -> list[Piece]:
        if self._raw:
            return [text] if text else []
        out: list[Piece] = []
        while text:
            text = self._inside(text, out) if self._block is not None else self._outside(text, out)
        return out

    def _outside(self, text: str, out: list[Piece]) -> str:
        held = self._held + text
        at = held.find(TOOL_CALL_OPEN)
        if at < 0:
            keep = _partial_tag(held, TOOL_CALL_OPEN)
            body = held[: len(held) - keep]
            shown = body.rstrip()
            self._held = body[len(shown) :] + held[len(held) - keep :]
            if shown and not self._calls:
                out.append(shown)
            return ""
        before = held[:at]
        shown = before.rstrip()
        if shown and not self._calls:
            out.append(shown)
        self._space = before[len(shown) :]
        self._held = ""
        self._block = ""
        return held[at + len(TOOL_CALL_OPEN) :]

    def _inside(self, text: str, out: list[Piece]) -> str:
        assert self._block is not None
        block = self._block + text
        at = block.find(TOOL_CALL_CLOSE)
        if at < 0:
            self._block = block
            return ""
        call = _call_of(block[:at].strip())
        self._block = None
        if call is None:
            self._fail(block, out)
            return ""
        out.append(call)
        self._calls += 1
        return block[at + len(TOOL_CALL_CLOSE) :]

    def _fail(self, block: str, out: list[Piece]) -> None:
        out.append(self._space + TOOL_CALL_OPEN + block)
        self._raw = True

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self._block is not None:
            call = _call_of(self._block.strip())
            if call is None:
                self._fail(self._block, out)
            else:
                out.append(call)
            self._block = None
        elif self._held and not self._calls and not self._raw:
            out.append(self._held)
        self._held = ""
        return out


TOOL_CALL_PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
    "qwen25": HermesParser,
}
"""Tool-call parsers by name (``--tool-call-parser``)."""


def make_tool_parser(name: str) -> ToolCallParser:
    """Return a new parser of the kind ``name`` names.

    Raises:
        ValueError: an unknown name (the known ones are listed).
    """
    try:
        return TOOL_CALL_PARSERS[name]()
    except KeyError:
        known = ", ".join(sorted(TOOL_CALL_PARSERS))
        raise ValueError(f"unknown tool-call parser {name!r}; known: {known}") from None


def parse_reply(parser: ToolCallParser, text: str) -> ParsedReply:
    """Parse a whole reply with a fresh ``parser``; content is ``None`` when empty and
    there are calls."""
    pieces = parser.feed(text) + parser.finish()
    content = "".join(p for p in pieces if isinstance(p, str))
    calls = tuple(p for p in pieces if isinstance(p, ParsedCall))
    return ParsedReply(content if content or not calls else None, calls)
