"""Admission schedulers for the owned-cache engines: which queued request goes next (§7.0).

Under load the queue decides as much as eviction does, so admission is part of the
policy. The schedulers, by name (:data:`SCHEDULERS`):

- ``fcfs``: arrival order, head-of-line blocking (SGLang's and vLLM's default).
- ``lpm``: longest cached prefix first (SGLang's ``lpm``), arrival order on ties.
- ``workflow``: pbkv's: the oldest workflow first, a request whose prompt is mostly
  cached or loading ahead of those that would recompute most of theirs, and requests of
  workflows outside the *cohort* (the oldest workflows whose contexts fit in the cache
  together) held back while that pays (:mod:`pbkv.engines.workflow_scheduler`).
  ``workflow-retract`` also retracts younger workflows' running requests.
- ``continuum`` and ``autellix``: the 2025–26 baselines, Continuum's program-level FCFS
  with pinned programs first (:mod:`pbkv.engines.continuum`) and Autellix's program-level
  least attained service (:mod:`pbkv.engines.autellix`).

``lpm`` and ``workflow`` try requests past one that does not fit (bypass), but a request
overtaken ``max_bypass`` times goes first, and while it does not fit nothing behind it
is admitted, so no request starves (:mod:`pbkv.engines.ranked`).

Batch composition is the scheduler's call too. ``fcfs`` and ``lpm`` leave the engine
its fixed chunk (``max_prefill_tokens`` a step, 8,192 in the sim as SGLang's chunked
prefill on large GPUs): a step that carries a full chunk is compute-bound for seconds,
and every decoding request gains one token in it. ``workflow`` asks for *balanced*
(stall-free) batches instead: while requests decode, a step carries only the prefill
tokens that fit in the decode step's idle compute (Sarathi-Serve's token budget,
Agrawal et al., OSDI 2024). ``fcfs-balanced`` is ``fcfs`` with balanced batches, so
batch composition's share of a gain is measured apart.
"""

from __future__ import annotations

from collections.abc import Callable

from pbkv.engines.admission import ForwardCosts
from pbkv.engines.ranked import (
    DEFAULT_MAX_BYPASS,
    DEFAULT_MAX_RETRACTIONS,
    AdmitCall,
    FCFSScheduler,
    LPMScheduler,
    Scheduler,
    note_waiting,
)
from pbkv.engines.workflow_scheduler import DEFAULT_COHORT_FILL, WorkflowScheduler

__all__ = [
    "DEFAULT_COHORT_FILL",
    "DEFAULT_MAX_BYPASS",
    "DEFAULT_MAX_RETRACTIONS",
    "SCHEDULERS",
    "AdmitCall",
    "ForwardCosts",
    "FCFSScheduler",
    "LPMScheduler",
    "Scheduler",
    "WorkflowScheduler",
    "get_scheduler",
    "note_waiting",
]


def balanced_fcfs_scheduler() -> FCFSScheduler:
    """Return ``fcfs`` with stall-free batches (``fcfs-balanced``), which measures the
    share of a gain that batch composition alone gives."""
    scheduler = FCFSScheduler(balanced_prefill=True)
    scheduler.name = "fcfs-balanced"
    return scheduler


def retracting_workflow_scheduler() -> WorkflowScheduler:
    """Return the ``workflow`` scheduler with retraction on (``workflow-retract``)."""
    scheduler = WorkflowScheduler(preempt=True)
    scheduler.name = "workflow-retract"
    return scheduler


def continuum_scheduler() -> Scheduler:
    """Return Continuum's program-level FCFS, pinned programs first (``continuum``,
    :mod:`pbkv.engines.continuum`)."""
    from pbkv.engines.continuum import ContinuumScheduler

    return ContinuumScheduler()


def autellix_scheduler() -> Scheduler:
    """Return Autellix's program-level least-attained-service scheduler (``autellix``,
    :mod:`pbkv.engines.autellix`)."""
    from pbkv.engines.autellix import AutellixScheduler

    return AutellixScheduler()


SCHEDULERS: dict[str, Callable[[], Scheduler]] = {
    "fcfs": FCFSScheduler,
    "lpm": LPMScheduler,
    "workflow": WorkflowScheduler,
    "workflow-retract": retracting_workflow_scheduler,
    "fcfs-balanced": balanced_fcfs_scheduler,
    "continuum": continuum_scheduler,
    "autellix": autellix_scheduler,
}


def get_scheduler(name: str) -> Scheduler:
    """Return a new scheduler registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    try:
        factory = SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(SCHEDULERS)}") from None
    return factory()
