"""Replies on an engine that samples no text: :class:`Simulated` and the ids it scripts.

The sim engine emits scripted output instead of sampling: a call's :class:`Simulated`
reply (its text, length, exact ids and tool/think gap), or filler up to
``max_new_tokens`` without one. Real engines ignore it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pbkv.live.chat import ChatFormat


@dataclass(frozen=True, slots=True)
class Simulated:
    """What an agent's reply is on an engine that samples no text (the sim engine).

    Args:
        text: the reply's text (routers parse it as they parse a real reply).
        output_tokens: the reply's length in tokens; the text is padded with filler to
            it (``0`` = the text's own length).
        token_ids: exact output ids instead of ``text`` (replays, bundled apps).
        gap_s: tool/think time before the call, in (virtual) seconds.
    """

    text: str = ""
    output_tokens: int = 0
    token_ids: tuple[int, ...] | None = None
    gap_s: float = 0.0


def check_simulated(simulated: object) -> None:
    """Refuse a ``simulated`` reply that is not a well-formed :class:`Simulated`."""
    if not isinstance(simulated, Simulated):
        raise TypeError(
            f"simulated must be a pbkv.Simulated or None, got {type(simulated).__name__}"
        )
    if not isinstance(simulated.text, str):
        raise TypeError(f"simulated.text must be a str, got {type(simulated.text).__name__}")
    tokens = simulated.output_tokens
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise TypeError(f"simulated.output_tokens must be an int, got {tokens!r}")
    if tokens < 0:
        raise ValueError(f"simulated.output_tokens must be >= 0, got {tokens}")
    gap_s = simulated.gap_s
    if isinstance(gap_s, bool) or not isinstance(gap_s, numbers.Real):
        raise TypeError(f"simulated.gap_s must be a number of seconds, got {gap_s!r}")
    if not 0 <= gap_s < math.inf:
        raise ValueError(f"simulated.gap_s must be finite and >= 0, got {gap_s}")
    if simulated.token_ids is not None:
        checked_token_ids("simulated.token_ids", simulated.token_ids)


def checked_token_ids(name: str, ids: Iterable[int]) -> tuple[int, ...]:
    """Return ``ids`` as a tuple of token ids (Python ints), or refuse them naming ``name``.

    A tuple of ints is returned as it is (no copy); lists and numpy integers are converted.

    Raises:
        TypeError: ``ids`` is text, a mapping or not iterable, or holds a non-integer
            (a ``bool`` included); the first such position is named.
        ValueError: an id is negative.
    """
    if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be a sequence of int token ids, got {type(ids).__name__}")
    checked = ids if type(ids) is tuple else tuple(ids)
    if not all(type(t) is int for t in checked):
        for i, t in enumerate(checked):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise TypeError(f"{name}[{i}] must be an int token id, got {t!r}")
        checked = tuple(int(t) for t in checked)
    if checked and min(checked) < 0:
        i = next(i for i, t in enumerate(checked) if t < 0)
        raise ValueError(f"{name}[{i}] must be >= 0, got {checked[i]}")
    return checked


def scripted_output(
    chat: ChatFormat, simulated: Simulated | None, max_new_tokens: int
) -> tuple[int, ...]:
    """Return the output ids the sim engine emits for a call.

    ``simulated.token_ids`` as given; else its text, padded with filler to its
    ``output_tokens`` (or to ``max_new_tokens`` without a simulated reply), then the
    end-of-turn marker.

    Raises:
        ValueError / TypeError: ``simulated.token_ids`` is empty or not token ids.
    """
    if simulated is not None and simulated.token_ids is not None:
        ids = checked_token_ids("simulated.token_ids", simulated.token_ids)
        if not ids:
            raise ValueError("simulated.token_ids must not be empty")
        return ids
    text = simulated.text if simulated is not None else ""
    wanted = simulated.output_tokens if simulated is not None else max_new_tokens
    body = chat.encode(text) if text else ()
    stop = chat.encode(chat.stop_text)
    filler = max(0, wanted - len(body) - len(stop))
    return body + _filler_ids(chat) * filler + stop


def scripted_floor(simulated: Simulated | None, max_new_tokens: int) -> int:
    """Return a length :func:`scripted_output` never goes below, without building it."""
    if simulated is None:
        return max_new_tokens
    if simulated.token_ids is not None:
        return len(simulated.token_ids)
    return simulated.output_tokens


def _filler_ids(chat: ChatFormat) -> tuple[int, ...]:
    ids = chat.encode(" .")
    return ids[-1:] if ids else (0,)
