"""Workflow traces on disk: one JSON object per line, a versioned msgspec schema (§6).

A trace record holds what a predictor may learn from: the app, the task (text and the
hidden features that drove routing), the ordered agent steps with their prompt token
counts per segment, output tokens and tool/think gaps, and why the workflow ended.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import msgspec

logger = logging.getLogger(__name__)

TRACE_VERSION = 1
END = "END"
"""The pseudo-agent that stands for workflow termination in forecasts."""

EndReason = Literal["end", "aborted", "error", "recursion_limit"]

MAX_TOKENS = 10_000_000
"""Largest token count a trace may give one segment or one output (10M: beyond any model's
context today); larger is a corrupt line, refused before it reaches a model or an array."""
MAX_GAP_S = 86_400.0
"""Longest tool/think gap before a step (a day)."""
MAX_STEPS = 100_000
"""Most steps one workflow trace may hold."""
MAX_SEGMENTS = 64
"""Most prompt segments one step may hold."""

_Tokens = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]


class SegmentCount(msgspec.Struct, frozen=True, array_like=True):
    """Token count of one prompt segment (``preamble``, ``role`` or ``context``)."""

    kind: Literal["preamble", "role", "context"]
    tokens: _Tokens


class TraceStep(msgspec.Struct, frozen=True):
    """One agent invocation: who ran, how long its prompt and output were, the gap before it.

    ``context_tail`` is the text of the latest message(s) of the step's context (what the
    engine's last-prefill hidden state mostly reflects), or ``""`` when the app records
    none. Added after version 1 shipped, at the end with a default: older lines decode.
    """

    agent: Annotated[str, msgspec.Meta(min_length=1)]
    segments: Annotated[list[SegmentCount], msgspec.Meta(max_length=MAX_SEGMENTS)]
    output_tokens: _Tokens
    gap_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_GAP_S)] = 0.0
    context_tail: str = ""


class TraceRecord(msgspec.Struct, frozen=True):
    """One workflow's trace (schema version :data:`TRACE_VERSION`)."""

    version: int
    app: str
    task_id: str
    task_text: str
    steps: Annotated[list[TraceStep], msgspec.Meta(max_length=MAX_STEPS)]
    end_reason: EndReason = "end"
    task_features: dict[str, float | str] = {}

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(s.agent for s in self.steps)


@dataclass(frozen=True, slots=True)
class TraceLineError:
    """One line of a trace file that could not be read.

    Args:
        path: the trace file.
        line: 1-based line number.
        message: what was wrong, with msgspec's field path (e.g. ``$.steps[0].agent``).
    """

    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


class TraceFileError(ValueError):
    """A trace file holds a bad line and the reader was asked to be strict.

    Attributes:
        error: the first bad line.
    """

    def __init__(self, error: TraceLineError) -> None:
        super().__init__(str(error))
        self.error = error


class TraceReadResult(NamedTuple):
    """What :func:`read_traces` found: the good records and the bad lines, in file order."""

    records: list[TraceRecord]
    errors: list[TraceLineError]


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(TraceRecord)


def write_traces(path: str | Path, records: Iterable[TraceRecord]) -> int:
    """Write ``records`` to ``path`` as JSON lines, replacing the file.

    The lines go to a temporary file beside ``path`` that then replaces it, so a reader
    never sees a half-written file and ``records`` may come from ``path`` itself.

    Args:
        path: the file to write; its folder must exist.
        records: the traces, written in order, one per line.

    Returns:
        The number of records written.
    """
    target = Path(path)
    count = 0
    mode = target.stat().st_mode & 0o777 if target.exists() else 0o644
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            for record in records:
                f.write(_ENCODER.encode(record))
                f.write(b"\n")
                count += 1
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return count


def read_traces(path: str | Path, *, strict: bool = False, warn: bool = True) -> TraceReadResult:
    """Read the traces of a JSON-lines file; blank lines are ignored.

    A line that is not JSON, does not match the schema, or has a version other than
    :data:`TRACE_VERSION` is bad. By default each bad line is logged as a warning and
    skipped.

    Args:
        path: the trace file.
        strict: raise on the first bad line instead of skipping it.
        warn: log each bad line (off for a second read of the same file, so each
            warning is printed once).

    Returns:
        The good records and the bad lines, each in file order.

    Raises:
        TraceFileError: ``strict`` and a line is bad; the message names file, line and field.
        OSError: the file cannot be opened.
    """
    path = Path(path)
    records: list[TraceRecord] = []
    errors: list[TraceLineError] = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(_decode_line(line))
            except msgspec.DecodeError as exc:
                error = TraceLineError(path, number, str(exc))
                if strict:
                    raise TraceFileError(error) from exc
                if warn:
                    logger.warning("skipping bad trace line %s", error)
                errors.append(error)
    return TraceReadResult(records, errors)


def _decode_line(line: bytes) -> TraceRecord:
    record = _DECODER.decode(line)
    if record.version != TRACE_VERSION:
        raise msgspec.ValidationError(
            f"unsupported trace version {record.version} (expected {TRACE_VERSION})"
            " - at `$.version`"
        )
    return record
