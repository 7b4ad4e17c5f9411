"""Serve a recorded workload: replay mode of the live runtime (§1, §4).

Each :class:`~pbkv.actors.workload.Workflow` script is replayed through a live workflow
session (:func:`pbkv.live.driver.replay_workflow`), so the studies and live apps share
one runtime: the same actors, events, supervision and cache management.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pbkv.actors.workflow import WorkflowOutcome
from pbkv.actors.workload import Workflow
from pbkv.engines.base import Engine
from pbkv.kvmanager import KVManager
from pbkv.predictor.base import Forecaster
from pbkv.runtime import EventRecorder


async def serve_workflows(
    workflows: Sequence[Workflow],
    *,
    engine: Engine,
    kv: KVManager,
    forecasters: Sequence[Forecaster] = (),
    concurrency: int = 8,
    recorder: EventRecorder | None = None,
    on_outcome: Callable[[WorkflowOutcome], None] | None = None,
    predictor_in_thread: bool = False,
    open_loop: bool = False,
) -> list[WorkflowOutcome]:
    """Replay ``workflows``, ``concurrency`` at a time, and return their outcomes.

    Starts the live runtime over ``engine`` (engine, predictor when ``forecasters`` is
    non-empty, KV-manager and agent actors), replays each workflow in a session as
    slots free up, and stops everything in reverse dependency order. A step the
    engine fails is retried once, then that workflow alone ends ``error``.

    Args:
        workflows: the workload, in submission order.
        engine: an engine whose cache ``kv`` manages (owned cache).
        kv: the KV manager.
        forecasters: predictor fallback chain (e.g. ``[graphsage, markov]``).
        concurrency: workflows in flight at once, >= 1.
        recorder: appends every lifecycle event to a JSONL file.
        on_outcome: called as each workflow ends (progress bars).
        predictor_in_thread: run the forecasters in a worker thread (real-time serving
            with a learned model); inline keeps virtual-time runs deterministic.
        open_loop: start each workflow no earlier than its ``arrival_s``.

    Returns:
        One outcome per workflow, in completion order.

    Raises:
        ValueError: ``concurrency < 1`` or duplicate workflow ids.
        ActorFailed: an actor failed past its supervision budget.
    """
    from pbkv.live.chat import raw_format
    from pbkv.live.driver import serve_replays
    from pbkv.live.session import serve_runtime

    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    ids = [w.workflow_id for w in workflows]
    if len(set(ids)) != len(ids):
        raise ValueError("workflow ids must be unique")
    if not workflows:
        return []
    async with serve_runtime(
        engine,
        kv,
        raw_format(),
        model_name="replay",
        forecasters=forecasters,
        max_calls_in_flight=1 << 30,
        predictor_in_thread=predictor_in_thread,
        recorder=recorder,
    ) as runtime:
        return await serve_replays(
            runtime, workflows, concurrency=concurrency, open_loop=open_loop, on_outcome=on_outcome
        )
