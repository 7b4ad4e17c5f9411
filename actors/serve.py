"""Serve a workload through the actor system: engine, KV manager, predictor, agents, workflows."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import trio

from pbkv.actors.agent import AgentActor
from pbkv.actors.engine import EngineActor
from pbkv.actors.events import StartWorkflow
from pbkv.actors.kvmanager import KVManagerActor
from pbkv.actors.predictor import PredictorActor
from pbkv.actors.workflow import WorkflowActor, WorkflowOutcome
from pbkv.actors.workload import Workflow
from pbkv.engines.base import Engine
from pbkv.kvmanager import KVManager
from pbkv.predictor.base import Forecaster
from pbkv.runtime import ActorRef, ActorSystem, EventRecorder, open_actor_system


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
) -> list[WorkflowOutcome]:
    """Run ``workflows`` closed-loop, ``concurrency`` at a time, and return their outcomes.

    Spawns the engine, predictor (when ``forecasters`` is non-empty; the chain falls
    back in order), KV-manager and one agent actor per agent, then one workflow actor
    per workflow as slots free up. Everything stops in reverse dependency order.

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

    Returns:
        One outcome per workflow, in completion order.

    Raises:
        ValueError: ``concurrency < 1`` or duplicate workflow ids.
        ActorFailed: an actor failed past its supervision budget.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    ids = [w.workflow_id for w in workflows]
    if len(set(ids)) != len(ids):
        raise ValueError("workflow ids must be unique")
    if not workflows:
        return []
    agents = sorted({s.agent for w in workflows for s in w.steps})
    outcomes: list[WorkflowOutcome] = []
    async with open_actor_system() as system:
        await system.spawn(EngineActor(engine), name="engine")
        predictor: ActorRef | None = None
        vocab: tuple[str, ...] = ()
        if forecasters:
            predictor = await system.spawn(
                PredictorActor(forecasters, run_in_thread=predictor_in_thread), name="predictor"
            )
            vocab = forecasters[0].agents
        kvm = await system.spawn(
            KVManagerActor(kv, predictor, vocab, recorder=recorder),
            name="kv-manager",
            depends_on=["predictor"] if predictor else [],
        )
        agent_refs = {
            a: await system.spawn(AgentActor(a, engine), name=f"agent/{a}", depends_on=["engine"])
            for a in agents
        }
        send, receive = trio.open_memory_channel[WorkflowOutcome](math.inf)
        pending = iter(workflows)
        async with send:
            for wf in _take(pending, concurrency):
                await _launch(system, wf, agent_refs, kvm, send)
            async for outcome in receive:
                outcomes.append(outcome)
                if on_outcome is not None:
                    on_outcome(outcome)
                for wf in _take(pending, 1):
                    await _launch(system, wf, agent_refs, kvm, send)
                if len(outcomes) == len(workflows):
                    break
    return outcomes


def _take(it: Iterable[Workflow], n: int) -> list[Workflow]:
    out = []
    for wf in it:
        out.append(wf)
        if len(out) == n:
            break
    return out


async def _launch(
    system: ActorSystem,
    wf: Workflow,
    agent_refs: dict[str, ActorRef],
    kvm: ActorRef,
    send: trio.MemorySendChannel[WorkflowOutcome],
) -> None:
    depends = ["kv-manager", *(f"agent/{a}" for a in {s.agent for s in wf.steps})]
    actor = WorkflowActor(wf, agent_refs, kvm, send.clone())
    ref = await system.spawn(actor, name=f"workflow/{wf.workflow_id}", depends_on=depends)
    await ref.tell(StartWorkflow())
