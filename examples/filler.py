"""Filler text: templated lines with their slots filled in, tokenized to an exact length.

The generated apps' outputs, tool results and documents are synthetic but real tokens:
random lines of an app's templates (``"def {name}(items, limit={n}):"``) with each slot
drawn from the app's values. Template pieces and slot values are tokenized once and
concatenated, so filling costs no tokenizer call; the ids decode to the filled-in text.
"""

from __future__ import annotations

import functools
import random
import string
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from pbkv.examples.chat import encode_piece

LineValues = Callable[[random.Random], Mapping[str, str]]
"""Draw one line's slot values with the given generator: a mapping from slot to text."""


def from_pools(pools: Mapping[str, Sequence[str]]) -> LineValues:
    """Return line values drawn from ``pools``, each slot's the first time a line uses it.

    So a line draws only for the slots it has, and a slot that appears twice in a line
    gets the same value both times.
    """
    return functools.partial(_PoolDraw, pools)


class _PoolDraw(dict[str, str]):
    """One line's slot values, drawn from their pools on first use."""

    def __init__(self, pools: Mapping[str, Sequence[str]], draw: random.Random) -> None:
        super().__init__()
        self._pools = pools
        self._draw = draw

    def __missing__(self, slot: str) -> str:
        value = self[slot] = self._draw.choice(self._pools[slot])
        return value


def fill_lines(
    header: str,
    lines: Sequence[str],
    n_tokens: int,
    rng: np.random.Generator,
    values: LineValues,
    closing: str = "",
) -> tuple[int, ...]:
    """Return ``header``, random filled-in ``lines``, then ``closing``, as ``n_tokens`` ids.

    The last line is cut off to fit; a header too long to fit is kept whole (and then
    the ids are more than ``n_tokens``). Draws one seed from ``rng``: the lines and their
    slot values come from a generator seeded with it.

    Args:
        header: text that opens the ids, before any line.
        lines: templates with ``{slot}`` fields; each is followed by a newline.
        n_tokens: how many ids to return, ``closing`` included.
        rng: the stream the seed is drawn from.
        values: draws each line's slot values.
        closing: text that ends the ids, such as ``<|im_end|>\\n`` for an agent's output.
    """
    draw = random.Random(int(rng.integers(2**63)))
    end = encode_piece(closing)
    ids = list(encode_piece(header))
    n_lines_tokens = max(n_tokens - len(end), len(ids))
    while len(ids) < n_lines_tokens:
        template = draw.choice(lines)
        ids += fill_template(template, values(draw))
    return tuple(ids[:n_lines_tokens]) + end


def fill_template(template: str, values: Mapping[str, str]) -> list[int]:
    """Return the ids of ``template`` with its slots filled in from ``values``, newline included."""
    ids: list[int] = []
    for literal, slot in _template_pieces(template):
        ids += literal
        if slot:
            ids += encode_piece(values[slot])
    return ids


@functools.cache
def _template_pieces(template: str) -> tuple[tuple[tuple[int, ...], str | None], ...]:
    """Split ``template`` (plus a newline) into (literal ids, following slot name) pairs."""
    parsed = string.Formatter().parse(template + "\n")
    return tuple((encode_piece(literal), slot) for literal, slot, _, _ in parsed)
