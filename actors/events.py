"""Lifecycle events and commands exchanged by pbkv's actors (§4).

Frozen, tagged msgspec Structs: passed as objects in-process, encoded by
:class:`pbkv.runtime.EventRecorder` for ``--record events.jsonl`` and replay. New fields
are added at the end with defaults (schema evolution).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

TerminationReason = Literal["end", "aborted", "error", "recursion_limit"]

RAN_TO_END: tuple[TerminationReason, ...] = ("end", "recursion_limit")
"""Reasons of workflows that ran their course: latency statistics average over these only
(an ``error`` or ``aborted`` workflow's time says nothing of the policy's)."""


class Event(msgspec.Struct, frozen=True, tag=True):
    """Base of the lifecycle events; ``at_s`` is the emitter's clock time."""


class WorkflowStarted(Event, frozen=True, tag=True):
    workflow_id: str
    app: str
    task_id: str
    tenant: str = ""
    at_s: float = 0.0
    task_text: str = ""


class AgentInvoked(Event, frozen=True, tag=True):
    """``prompt_segments``: token count of each prompt segment (preamble, role, context);
    ``context_tail``: the newest text in the context (what this agent reacts to)."""

    workflow_id: str
    step: int
    agent: str
    prompt_segments: list[int]
    at_s: float = 0.0
    context_tail: str = ""


class PrefillDone(Event, frozen=True, tag=True):
    """``hidden``: post-norm hidden state of the last prefill token, or ``None``."""

    workflow_id: str
    step: int
    cached_gpu_tokens: int
    cached_host_tokens: int
    computed_tokens: int
    hidden: list[float] | None = None
    at_s: float = 0.0


class AgentFinished(Event, frozen=True, tag=True):
    workflow_id: str
    step: int
    agent: str
    output_tokens: int
    latency_s: float
    at_s: float = 0.0
    ttft_s: float = 0.0


class WorkflowTerminated(Event, frozen=True, tag=True):
    workflow_id: str
    reason: TerminationReason
    at_s: float = 0.0


LifecycleEvent = WorkflowStarted | AgentInvoked | PrefillDone | AgentFinished | WorkflowTerminated


class Invoke(msgspec.Struct, frozen=True, tag=True):
    """Command to an AgentActor: run one invocation and report to ``reply_to``.

    ``reply_to`` is the workflow actor's ref, or a one-shot trio send channel of a live
    session (in-process only; not encoded). ``max_new_tokens`` is the decode budget (0 =
    the scripted output's length); ``sampling`` an ``engines.base.Sampling``;
    ``on_token`` a streaming callback; ``invocation_id`` names it for
    :class:`CancelInvocation` (unique per agent while it runs).
    """

    workflow_id: str
    step: int
    agent: str
    segments: list[tuple[int, ...]]
    output_token_ids: tuple[int, ...]
    tenant: str = ""
    reply_to: Any = None
    fixed_prefix_tokens: int = 0
    max_new_tokens: int = 0
    sampling: Any = None
    on_token: Any = None
    invocation_id: str = ""


class CancelInvocation(msgspec.Struct, frozen=True, tag=True):
    """Command to an AgentActor: cancel the invocation ``invocation_id`` if it still runs.

    The engine request is withdrawn and its leases released; no reply is sent.
    """

    invocation_id: str


class InvocationDone(msgspec.Struct, frozen=True, tag=True):
    """Reply to a workflow session: the invocation's engine result (or its error).

    ``retryable`` is false when the same request can never succeed (it does not fit).
    """

    step: int
    result: Any = None
    error: str | None = None
    retryable: bool = True


class ForecastRequest(msgspec.Struct, frozen=True, tag=True):
    """Ask the PredictorActor for one workflow's K-step forecast.

    ``reply`` is a one-shot trio send channel that receives a
    :class:`~pbkv.predictor.base.Forecast` (a ``(K, |V|+1)`` array and its columns), or
    ``None`` when every predictor in the fallback chain failed.
    """

    workflow_id: str
    app: str
    path: tuple[str, ...]
    task_text: str = ""
    hidden: Any = None
    reply: Any = None
    context_tail: str = ""
    tenant: str = ""


class PathObserved(msgspec.Struct, frozen=True, tag=True):
    """Tell the PredictorActor the path a workflow ran, as it ends (online learning).

    Sent for workflows that ran their course (``end``, ``recursion_limit``).
    """

    app: str
    path: tuple[str, ...]
    tenant: str = ""
    workflow_id: str = ""
