"""Workflow traces on disk: one JSON object per line, a versioned msgspec schema (§6).

A trace record holds what a predictor may learn from: the app, the task (text and the
hidden features that drove routing), the ordered agent steps with their prompt token
counts per segment, output tokens and tool/think gaps, and why the workflow ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Literal

import msgspec

TRACE_VERSION = 1
END = "END"
"""The pseudo-agent that stands for workflow termination in forecasts."""

EndReason = Literal["end", "aborted", "error", "recursion_limit"]


class SegmentCount(msgspec.Struct, frozen=True, array_like=True):
    """Token count of one prompt segment (``preamble``, ``role`` or ``context``)."""

    kind: Literal["preamble", "role", "context"]
    tokens: Annotated[int, msgspec.Meta(ge=0)]


class TraceStep(msgspec.Struct, frozen=True):
    """One agent invocation: who ran, how long its prompt and output were, the gap before it."""

    agent: Annotated[str, msgspec.Meta(min_length=1)]
    segments: list[SegmentCount]
    output_tokens: Annotated[int, msgspec.Meta(ge=0)]
    gap_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class TraceRecord(msgspec.Struct, frozen=True):
    """One workflow's trace (schema version :data:`TRACE_VERSION`)."""

    version: int
    app: str
    task_id: str
    task_text: str
    steps: list[TraceStep]
    end_reason: EndReason = "end"
    task_features: dict[str, float | str] = {}

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(s.agent for s in self.steps)
