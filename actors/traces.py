"""Record live runs as predictor traces: lifecycle events (§4) → trace records (§6).

A :class:`TraceRecorder` is an event sink: hand it to the runtime
(``open_runtime(..., recorder=TraceRecorder("runs.jsonl"))``) and the KV-manager actor
gives it every event of every workflow, live calls, graph apps, replays and server
sessions alike. When a workflow terminates, its :class:`~pbkv.predictor.trace.TraceRecord`
(the same JSONL schema ``pbkv trace generate`` writes) is appended to the file, so
``pbkv train`` learns from what an app really did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import msgspec

from pbkv.actors.events import AgentFinished, AgentInvoked, WorkflowStarted, WorkflowTerminated
from pbkv.predictor.trace import TRACE_VERSION, SegmentCount, TraceRecord, TraceStep

__all__ = ["TraceRecorder", "segment_kinds"]


def segment_kinds(count: int) -> list[str]:
    """Return the kinds of a prompt's ``count`` segments, as the runtime builds prompts.

    Events carry segment lengths only; a session's prompt is ``context`` alone (raw
    text), ``preamble`` + ``context`` (one system message) or ``preamble``, ``role``
    ... + ``context`` (graph agents, replays, several system messages).
    """
    if count <= 1:
        return ["context"] * count
    return ["preamble", *["role"] * (count - 2), "context"]


@dataclass(slots=True)
class _Open:
    """A running workflow as its events so far describe it."""

    started: WorkflowStarted
    last_s: float
    steps: dict[int, TraceStep] = field(default_factory=dict)


class TraceRecorder:
    """Build one trace record per workflow from its lifecycle events.

    Each step is an ``AgentInvoked`` (a retry repeats its step and replaces it) with its
    ``AgentFinished``'s output length; its ``gap_s`` is the time from the workflow's
    previous finish (or start) to the invocation: the tool/think time. A step that never
    finished (an aborted call) keeps 0 output tokens. Events of a workflow whose start
    was not seen are ignored.

    Args:
        path: JSONL file each finished trace is appended to; ``None`` keeps them in
            :attr:`records` only.
        keep: also keep every finished record in :attr:`records`.

    Attributes:
        records: finished traces, in termination order (with ``keep``).
        written: traces appended to ``path``.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, keep: bool = True) -> None:
        self.path = None if path is None else Path(path)
        self.keep = keep
        self.records: list[TraceRecord] = []
        self.written = 0
        self._open: dict[str, _Open] = {}
        self._encoder = msgspec.json.Encoder()
        self._file = None if self.path is None else self.path.open("ab")

    def record(self, event: msgspec.Struct) -> None:
        """Take one lifecycle event; a ``WorkflowTerminated`` emits that workflow's trace.

        Raises:
            ValueError: the recorder is closed.
        """
        if self._file is not None and self._file.closed:
            raise ValueError(f"TraceRecorder for {self.path} is closed")
        match event:
            case WorkflowStarted(workflow_id=w, at_s=at):
                self._open[w] = _Open(event, at)
            case AgentInvoked(workflow_id=w, step=step, agent=agent) if w in self._open:
                run = self._open[w]
                kinds = segment_kinds(len(event.prompt_segments))
                run.steps[step] = TraceStep(
                    agent=agent,
                    segments=[
                        SegmentCount(k, n)  # type: ignore[arg-type]
                        for k, n in zip(kinds, event.prompt_segments, strict=True)
                    ],
                    output_tokens=0,
                    gap_s=round(max(0.0, event.at_s - run.last_s), 6),
                    context_tail=event.context_tail,
                )
            case AgentFinished(workflow_id=w, step=step, at_s=at) if w in self._open:
                run = self._open[w]
                known = run.steps.get(step)
                if known is not None:
                    run.steps[step] = msgspec.structs.replace(
                        known, output_tokens=event.output_tokens
                    )
                run.last_s = max(run.last_s, at)
            case WorkflowTerminated(workflow_id=w, reason=reason) if w in self._open:
                self._emit(self._open.pop(w), reason)
            case _:
                pass

    def _emit(self, run: _Open, reason: str) -> None:
        started = run.started
        record = TraceRecord(
            version=TRACE_VERSION,
            app=started.app,
            task_id=started.task_id,
            task_text=started.task_text,
            steps=[run.steps[s] for s in sorted(run.steps)],
            end_reason=reason,  # type: ignore[arg-type]
        )
        if self.keep:
            self.records.append(record)
        if self._file is not None:
            self._file.write(self._encoder.encode(record) + b"\n")
            self._file.flush()
            self.written += 1

    @property
    def open_workflows(self) -> tuple[str, ...]:
        """Workflows started and not yet terminated."""
        return tuple(self._open)

    def close(self) -> None:
        """Close the file (traces of workflows still open are not written). Idempotent."""
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
