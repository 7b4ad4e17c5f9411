"""Stop sequences applied to generated text, the same way for streamed and whole replies.

Plain code, no trio. :class:`StopWatch` watches the tokens as the engine produces them
and tells it to end the request at the token that completes a stop sequence (so no
token is decoded past it, and ``usage.completion_tokens`` counts only those generated);
the server then cuts the text at the first stop sequence, as OpenAI's ``stop`` does
(an engine that cannot end early, ``trtllm``, generates to its own end and is cut the
same way). The stop that *completes* first wins, as in an engine that checks the text
after every token (vLLM's stop strings): in ``"SbS"`` with stops ``["b", "SbS"]`` the
reply is ``"S"``, since ``"b"`` is complete before ``"SbS"`` is. While streaming, text
that could be the start of a stop sequence is held back until it is known not to be
one, so streamed pieces joined equal the whole reply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pbkv.live.chat import IncrementalDecoder


class StopCutter:
    """Cut text fed piece by piece at the first of ``stops``.

    Args:
        stops: stop sequences (empty strings are ignored); none → text passes through.
    """

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Return the part of ``text`` that is safe to emit now (``""`` once stopped)."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        held = self._held + text
        start = self._first_stop(held)
        if start is not None:
            self.stopped = True
            self._held = ""
            return held[:start]
        keep = self._partial_suffix(held)
        self._held = held[len(held) - keep :]
        return held[: len(held) - keep]

    def flush(self) -> str:
        """Return the text still held back (the generation ended without a stop)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _first_stop(self, text: str) -> int | None:
        """Return where the stop that ends first in ``text`` begins (the earlier start
        when two end together), or ``None``."""
        found = [(i + len(s), i) for s in self._stops if (i := text.find(s)) >= 0]
        return min(found)[1] if found else None

    def _partial_suffix(self, text: str) -> int:
        """Return the length of the longest end of ``text`` that begins a stop sequence."""
        for n in range(min(len(text), max(map(len, self._stops)) - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0


class StopWatch:
    """Say, token by token, when the generated text has completed one of ``stops``.

    Called by the engine with each output token (``WorkflowSession.call(until=...)``):
    the tokens are detokenized incrementally, as a stream is, and the first token whose
    text completes a stop returns ``True`` (and every later one).

    Args:
        stops: stop sequences (empty strings are ignored).
        decode: token ids → text (the runtime's ``chat.decode``).
    """

    def __init__(self, stops: Sequence[str], decode: Callable[[Sequence[int]], str]) -> None:
        self._cutter = StopCutter(stops)
        self._decoder = IncrementalDecoder(decode)

    def __call__(self, token: int) -> bool:
        """Add ``token``; return whether a stop sequence is complete."""
        if not self._cutter.stopped:
            self._cutter.feed(self._decoder.push(token))
        return self._cutter.stopped


def streamed_text(
    token_ids: Sequence[int], decode: Callable[[Sequence[int]], str], end: str
) -> str:
    """Return the text a stream of ``token_ids`` shows, so a whole reply says the same.

    A stream holds back text that ends in an incomplete UTF-8 sequence (decoded as
    U+FFFD) until a later token completes it (:class:`pbkv.live.chat.IncrementalDecoder`);
    a reply cut there (``max_tokens``) never shows it. So here: the decoded text of the
    longest run of leading tokens whose text does not end in U+FFFD, cut at the
    end-of-turn marker ``end``. As vLLM's detokenizer, the incomplete tail is dropped.

    Args:
        token_ids: the reply's output tokens.
        decode: token ids → text (the runtime's ``chat.decode``).
        end: the end-of-turn marker (``chat.stop_text``).
    """
    n = len(token_ids)
    text = decode(token_ids)
    while n and text.endswith("\ufffd"):
        n -= 1
        text = decode(token_ids[:n])
    at = text.find(end)
    return text if at < 0 else text[:at]


def cut(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """Return ``text`` cut at the first of ``stops``, and whether a stop was found."""
    cutter = StopCutter(stops)
    out = cutter.feed(text) + cutter.flush()
    return out, cutter.stopped
