"""The outcome of one workflow, however it ran (live app, replay or server session).

A workflow's logic lives in its session (:class:`pbkv.live.session.WorkflowSession`),
driven by the app's graph (:mod:`pbkv.live.driver`) or by a recorded script.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pbkv.actors.events import TerminationReason
from pbkv.engines.base import GenerateResult


@dataclass(frozen=True, slots=True)
class WorkflowOutcome:
    """How one workflow went: its end reason, timings and per-invocation results.

    ``path`` is the agents it ran, in order; ``error`` what ended it with ``error``.
    """

    workflow_id: str
    reason: TerminationReason
    start_s: float
    end_s: float
    results: tuple[GenerateResult, ...] = field(default=())
    path: tuple[str, ...] = ()
    error: str = ""

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s
