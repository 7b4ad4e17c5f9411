"""Live workflow sessions: the runtime an agent app embeds (DESIGN §1, §4).

:func:`open_runtime` starts the actor system (engine, KV manager, predictor, one actor
per agent) over an engine; inside it an app opens one :class:`WorkflowSession` per task
and calls agents with real prompts. Routing is the app's: it reads each
:class:`Reply` and decides what to call next. Every call emits the §4 lifecycle events,
so the KV manager scores, retires and prefetches exactly as in the studies.

This module holds the :class:`Runtime` (the actor system, its agent actors and open
sessions) and :func:`serve_runtime`, which starts it. A session is
:mod:`~pbkv.live.workflow`, one call of it :mod:`~pbkv.live.call`, and the replies of an
engine that samples no text :mod:`~pbkv.live.simulated`.
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from pbkv.actors.agent import AgentActor
from pbkv.actors.engine import EngineActor
from pbkv.actors.events import WorkflowStarted
from pbkv.actors.kvmanager import KVManagerActor
from pbkv.actors.predictor import PredictorActor, learns_agents
from pbkv.engines.base import Engine
from pbkv.kvmanager import KVManager, KVStatistics
from pbkv.live.call import CallFailed, Reply
from pbkv.live.chat import ChatFormat
from pbkv.live.simulated import Simulated
from pbkv.live.workflow import WorkflowSession
from pbkv.predictor.base import Forecaster
from pbkv.runtime import ActorRef, ActorSystem, EventRecorder, now_s, open_actor_system

# CallFailed, Reply, Simulated and WorkflowSession: re-exported for their importers here
__all__ = [
    "DEFAULT_MAX_IDLE_AGENTS",
    "CallFailed",
    "Reply",
    "Runtime",
    "RuntimeStatistics",
    "Simulated",
    "WorkflowSession",
    "serve_runtime",
]


@dataclass(frozen=True, slots=True)
class RuntimeStatistics:
    """A snapshot of a running runtime.

    Attributes:
        kv: the KV manager's counters (hit rates, evictions, prefetches).
        engine: the engine's statistics record.
        workflows_active / workflows_started: open sessions / sessions ever opened.
        ended_by_reason: ended sessions per reason (``end``, ``aborted``, ...).
        calls_in_flight: calls submitted and not yet answered.
        leases: live cache leases (requests and copies holding radix-tree nodes).
        agents_by_workflow: the agents each open or ended workflow called, in order
            of first call (bounded to the most recent ``history_limit`` workflows).
    """

    kv: KVStatistics
    engine: Any
    workflows_active: int
    workflows_started: int
    ended_by_reason: dict[str, int]
    calls_in_flight: int
    leases: int
    agents_by_workflow: dict[str, tuple[str, ...]]


DEFAULT_MAX_IDLE_AGENTS = 256
"""Agent actors a runtime keeps; past it the least recently used idle ones stop (each
holds memory, and a server's clients name agents freely)."""


class Runtime:
    """The live runtime: an actor system over one engine and its KV manager.

    Built by :func:`open_runtime`; open workflows with :meth:`workflow` or
    :meth:`open_workflow`.

    Attributes:
        engine / kv: the engine and the KV manager whose radix tree it allocates from.
        chat: the tokenizer and chat template of the engine's model.
        model_name: what ``/v1/models`` would list.
        call_slots: ``max_calls_in_flight`` slots the graph's and replays' calls share,
            waiting for one where a bare call would raise :class:`Overloaded`.
        max_idle_agents: agent actors kept (one per agent name, spawned on first call);
            past it the least recently used idle ones are stopped, and spawned again if
            called again.
        predictor: the predictor actor (its chain, statistics and online accuracy), or
            ``None`` when the runtime makes no forecasts.
        gap_scale: factor on every simulated tool and think time (a :class:`Simulated`
            reply's ``gap_s``, a simulated tool's latency, a replayed step's gap); real
            tools take the time they take.
    """

    def __init__(
        self,
        system: ActorSystem,
        engine: Engine,
        kv: KVManager,
        chat: ChatFormat,
        kv_manager: ActorRef,
        *,
        model_name: str,
        max_calls_in_flight: int,
        history_limit: int = 4096,
        max_idle_agents: int = DEFAULT_MAX_IDLE_AGENTS,
        predictor: PredictorActor | None = None,
        gap_scale: float = 1.0,
    ) -> None:
        self.system = system
        self.predictor = predictor
        self.gap_scale = gap_scale
        self.engine = engine
        self.kv = kv
        self.chat = chat
        self.model_name = model_name
        self.max_calls_in_flight = max_calls_in_flight
        # graph and replay calls wait here for room rather than fail (live.driver.admitted_call)
        self.call_slots = trio.Semaphore(max(1, max_calls_in_flight))
        self._kv_manager = kv_manager
        # agent actors by name, least recently handed out first; ``_handing`` counts the
        # callers between _agent() and their Invoke reaching the mailbox (never stopped then)
        self._agents: OrderedDict[str, tuple[ActorRef, AgentActor]] = OrderedDict()
        self._handing: Counter[str] = Counter()
        self.max_idle_agents = max_idle_agents
        self._spawn_lock = trio.Lock()
        self._ids = itertools.count()
        self._active: dict[str, WorkflowSession] = {}
        self._started = 0
        self._ended: Counter[str] = Counter()
        self._history: dict[str, tuple[str, ...]] = {}
        self._history_limit = history_limit
        self.calls_in_flight = 0

    def warm_start(self, app: str, agents: Sequence[str], edges: Sequence[tuple[str, str]]) -> None:
        """Give the online forecasters ``app``'s declared call graph to start from.

        A no-op without an online forecaster (a fixed chain, or no predictor).

        Mutates: the forecasters' models of ``app`` (learned counts are forgotten).
        """
        for forecaster in self.predictor.chain if self.predictor is not None else ():
            if learns_agents(forecaster):
                forecaster.warm_start(app, agents, edges)  # type: ignore[attr-defined]

    @property
    def samples_tokens(self) -> bool:
        """Whether the engine generates real tokens (else replies are :class:`Simulated`)."""
        return bool(getattr(self.engine, "samples_tokens", True))

    async def open_workflow(
        self,
        workflow_id: str | None = None,
        *,
        app: str = "live",
        task_id: str = "",
        task_text: str = "",
        tenant: str = "",
    ) -> WorkflowSession:
        """Open a workflow session; the caller must :meth:`WorkflowSession.end` it.

        Args:
            workflow_id: unique among open sessions; ``None`` = a fresh id.
            app / task_id / task_text: what the predictor sees of the task.
            tenant: cache namespace (cache salt); tenants never share cache nodes.

        Raises:
            ValueError: ``workflow_id`` is already open, or empty.
        """
        wf_id = f"wf-{next(self._ids)}" if workflow_id is None else workflow_id
        if not wf_id:
            raise ValueError("workflow_id must not be empty")
        if wf_id in self._active:
            raise ValueError(f"workflow {wf_id!r} is already open")
        session = WorkflowSession(self, wf_id, app, task_id, task_text, tenant)
        self._active[wf_id] = session
        self._started += 1
        try:
            await self._kv_manager.tell(
                WorkflowStarted(wf_id, app, task_id or wf_id, tenant, now_s(), task_text)
            )
        except BaseException:  # the runtime is stopped, or the caller cancelled: never opened
            del self._active[wf_id]
            self._started -= 1
            raise
        return session

    @asynccontextmanager
    async def workflow(
        self,
        workflow_id: str | None = None,
        *,
        app: str = "live",
        task_id: str = "",
        task_text: str = "",
        tenant: str = "",
    ) -> AsyncIterator[WorkflowSession]:
        """Open a workflow session for the ``async with`` block.

        Leaving the block ends it with ``end`` (unless :meth:`WorkflowSession.end` was
        called); an exception or cancellation escaping the block ends it ``aborted``.
        Arguments and errors as :meth:`open_workflow`.
        """
        session = await self.open_workflow(
            workflow_id, app=app, task_id=task_id, task_text=task_text, tenant=tenant
        )
        try:
            yield session
        except BaseException:
            await session.end("aborted")
            raise
        await session.end("end")

    def active_workflows(self) -> tuple[str, ...]:
        """Return the ids of the open sessions."""
        return tuple(self._active)

    def statistics(self) -> RuntimeStatistics:
        """Return a snapshot of the runtime's counters. Does not modify anything."""
        agents = dict(self._history)
        agents.update({w: s.agents for w, s in self._active.items()})
        return RuntimeStatistics(
            kv=self.kv.statistics(),
            engine=self.engine.statistics(),
            workflows_active=len(self._active),
            workflows_started=self._started,
            ended_by_reason=dict(self._ended),
            calls_in_flight=self.calls_in_flight,
            leases=self.kv.tree.lease_count(),
            agents_by_workflow=agents,
        )

    async def _agent(self, name: str) -> ActorRef:
        """Return ``name``'s agent actor, spawned on first use; the caller must call
        :meth:`_handed` once its ``Invoke`` is in the actor's mailbox (or it gave up).

        Agent names come from clients (``pbkv serve``'s ``X-PBKV-Agent``), so the actors
        are bounded: past ``max_idle_agents`` the least recently used idle ones are
        stopped and forgotten (a later call of that name spawns it again).
        """
        self._handing[name] += 1
        try:
            entry = self._agents.get(name)
            if entry is None:
                async with self._spawn_lock:
                    entry = self._agents.get(name)
                    if entry is None:
                        await self._stop_idle_agents(self.max_idle_agents - 1)
                        actor = AgentActor(name, self.engine)
                        ref = await self.system.spawn(
                            actor, name=f"agent/{name}", strategy="restart", depends_on=["engine"]
                        )
                        entry = self._agents[name] = (ref, actor)
            self._agents.move_to_end(name)
        except BaseException:
            self._handed(name)
            raise
        return entry[0]

    def _handed(self, name: str) -> None:
        """Mark one caller of :meth:`_agent` done handing ``name`` its invocation."""
        self._handing[name] -= 1
        if self._handing[name] <= 0:
            del self._handing[name]

    async def _stop_idle_agents(self, keep: int) -> None:
        """Stop and forget the least recently used idle agent actors until at most
        ``keep`` remain (busy ones, and ones a caller is handing work to, stay)."""
        excess = len(self._agents) - keep
        if excess <= 0:
            return
        idle = [
            n for n, (_, actor) in self._agents.items() if actor.idle and n not in self._handing
        ][:excess]
        for name in idle:
            del self._agents[name]
            await self.system.remove(f"agent/{name}")

    def _ended_session(self, session: WorkflowSession, reason: str) -> None:
        self._active.pop(session.workflow_id, None)
        self._ended[reason] += 1
        self._history[session.workflow_id] = session.agents
        while len(self._history) > self._history_limit:
            del self._history[next(iter(self._history))]


@asynccontextmanager
async def serve_runtime(
    engine: Engine,
    kv: KVManager,
    chat: ChatFormat,
    *,
    model_name: str,
    forecasters: Sequence[Forecaster] = (),
    max_calls_in_flight: int = 1024,
    predictor_in_thread: bool = False,
    recorder: EventRecorder | None = None,
    gap_scale: float = 1.0,
) -> AsyncIterator[Runtime]:
    """Start the actor system over ``engine`` and ``kv`` and yield the :class:`Runtime`.

    The engine actor restarts within a budget (its loop fails in-flight requests into
    their workflows); agents are spawned on first call and restart likewise.

    Args:
        engine / kv: an owned-cache engine and the KV manager it allocates from.
        chat: the model's tokenizer and chat template.
        model_name: the served model's name.
        forecasters: the predictor's fallback chain (empty = no forecasts).
        max_calls_in_flight: calls admitted at once before :class:`Overloaded`.
        predictor_in_thread: run the forecasters in a worker thread (real time).
        recorder: appends every lifecycle event to a JSONL file.
        gap_scale: factor on simulated tool and think times (:class:`Runtime`).
    """
    async with open_actor_system() as system:
        await system.spawn(
            EngineActor(engine), name="engine", strategy="restart", max_restarts=3, within_s=60.0
        )
        predictor: ActorRef | None = None
        predictor_actor: PredictorActor | None = None
        if forecasters:
            predictor_actor = PredictorActor(forecasters, run_in_thread=predictor_in_thread)
            predictor = await system.spawn(predictor_actor, name="predictor")
        kvm = await system.spawn(
            KVManagerActor(kv, predictor, recorder=recorder),
            name="kv-manager",
            depends_on=["predictor"] if predictor else [],
        )
        runtime = Runtime(
            system,
            engine,
            kv,
            chat,
            kvm,
            model_name=model_name,
            max_calls_in_flight=max_calls_in_flight,
            predictor=predictor_actor,
            gap_scale=gap_scale,
        )
        try:
            yield runtime
        finally:
            with trio.CancelScope(shield=True):
                for session in list(runtime._active.values()):
                    await session.end("aborted")
