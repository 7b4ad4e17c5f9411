"""Workflow scripts: what a replay serves through a live session, with real token ids.

An app (``pbkv.examples``) turns a task into a :class:`Workflow`: the ordered agent
invocations its router chose, each with its prompt as segments of token ids (shared
preamble, agent role prompt, workflow context) and the tokens the agent outputs. The
routing decisions come from the app's router and the task's hidden features; the
predictor only ever sees the executed prefix of the path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Literal

from pbkv.predictor.trace import TRACE_VERSION, SegmentCount, TraceRecord, TraceStep

SegmentKind = Literal["preamble", "role", "context"]


@dataclass(frozen=True, slots=True)
class Segment:
    """One part of a prompt.

    Args:
        kind: ``preamble`` (shared by every agent of the app), ``role`` (one agent's role
            prompt) or ``context`` (this workflow's task and history).
        token_ids: the segment's token ids, in prompt order.
    """

    kind: SegmentKind
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Step:
    """One agent invocation of a workflow.

    Args:
        agent: the invoked agent's name (a node of the app's call graph).
        segments: the prompt, in order; ``prompt_token_ids`` is their concatenation.
        output_token_ids: the tokens the agent generates (their count is the decode length;
            an empty output replays as one token, since an engine generates at least one).
        gap_s: tool/think time before this invocation is issued, in seconds.
        context_tail: the text of the latest message(s) of the context, or ``""`` when
            the app records none (a per-step text signal for predictors).
    """

    agent: str
    segments: tuple[Segment, ...]
    output_token_ids: tuple[int, ...]
    gap_s: float = 0.0
    context_tail: str = ""

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return tuple(chain.from_iterable(s.token_ids for s in self.segments))

    @property
    def prompt_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    @property
    def output_tokens(self) -> int:
        return len(self.output_token_ids)


@dataclass(frozen=True, slots=True)
class Workflow:
    """One workflow instance: a task and the agent invocations it makes.

    Args:
        workflow_id: unique within a workload.
        app: the app's registry name.
        task_id: the task's id (stable across runs with the same seed).
        task_text: the task as the agents see it (carries cues of the hidden features).
        task_features: the hidden features that drove routing (for analysis only; never
            given to a predictor).
        steps: the invocations in order.
        end_reason: why the workflow ended (``end``, ``aborted``, ``error``,
            ``recursion_limit``).
        tenant: cache namespace; tenants never share cache nodes.
        arrival_s: when the workflow is submitted, seconds from the start of the run
            (used by open-loop workloads; closed-loop runners ignore it).
    """

    workflow_id: str
    app: str
    task_id: str
    task_text: str
    steps: tuple[Step, ...]
    task_features: dict[str, float | str] = field(default_factory=dict)
    end_reason: str = "end"
    tenant: str = ""
    arrival_s: float = 0.0

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(s.agent for s in self.steps)

    def to_trace(self) -> TraceRecord:
        """Return the token-count trace of this workflow (the predictor's training record)."""
        return TraceRecord(
            version=TRACE_VERSION,
            app=self.app,
            task_id=self.task_id,
            task_text=self.task_text,
            task_features=dict(self.task_features),
            steps=[
                TraceStep(
                    agent=s.agent,
                    segments=[SegmentCount(g.kind, len(g.token_ids)) for g in s.segments],
                    output_tokens=s.output_tokens,
                    gap_s=s.gap_s,
                    context_tail=s.context_tail,
                )
                for s in self.steps
            ],
            end_reason=self.end_reason,
        )
