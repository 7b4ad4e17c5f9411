"""The Mooncake FAST'25 request traces (bundled; Apache-2.0, see ``data/mooncake/``).

One request per line: arrival ``timestamp`` (ms from the trace start), ``input_length`` and
``output_length`` (tokens) and ``hash_ids``, one id per 512-token block of the prompt (equal
ids = identical prefix block). The traces carry no agent or session labels, so they serve
prefix-reuse studies at the block level, not the agent predictor.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import msgspec

from pbkv.examples.data import find_data_file, read_data_text

MOONCAKE_TRACES = ("conversation", "synthetic")
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry (Mooncake's block size)."""
_MAX_TOKENS = 10_000_000

_Count = Annotated[int, msgspec.Meta(ge=0, le=_MAX_TOKENS)]


class MooncakeRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One request of a Mooncake trace (fields renamed to carry their units)."""

    timestamp_ms: Annotated[int, msgspec.Meta(ge=0)] = msgspec.field(name="timestamp")
    input_tokens: _Count = msgspec.field(name="input_length")
    output_tokens: _Count = msgspec.field(name="output_length")
    hash_ids: tuple[Annotated[int, msgspec.Meta(ge=0)], ...] = msgspec.field(name="hash_ids")


_DECODER = msgspec.json.Decoder(MooncakeRequest)


def load_mooncake(
    name: str, data_dir: str | os.PathLike[str] | None = None
) -> tuple[MooncakeRequest, ...]:
    """Return the requests of the Mooncake trace ``name``, in file (arrival) order.

    Args:
        name: ``"conversation"`` (12,031 requests, ~59 min) or ``"synthetic"`` (3,993, ~17 min).
        data_dir: a data directory holding ``mooncake/``; ``$PBKV_DATA_DIR`` or the bundled
            traces when omitted.

    Raises:
        ValueError: an unknown ``name`` (lists the known ones), or a malformed line (names
            the file, line and field).
        FileNotFoundError: the trace file is missing.
    """
    if name not in MOONCAKE_TRACES:
        raise ValueError(f"unknown Mooncake trace {name!r}; known: {', '.join(MOONCAKE_TRACES)}")
    path = find_data_file(Path("mooncake") / f"{name}_trace.jsonl", data_dir)
    requests = []
    for number, line in enumerate(read_data_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            requests.append(_DECODER.decode(line))
        except msgspec.ValidationError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON: {exc}") from exc
    return tuple(requests)
