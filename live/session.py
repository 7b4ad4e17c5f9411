"""Live workflow sessions: the runtime an agent app embeds (DESIGN §1, §4).

:func:`open_runtime` starts the actor system (engine, KV manager, predictor, one actor
per agent) over an engine; inside it an app opens one :class:`WorkflowSession` per task
and calls agents with real prompts. Routing is the app's: it reads each
:class:`Reply` and decides what to call next. Every call emits the §4 lifecycle events,
so the KV manager scores, retires and prefetches exactly as in the studies.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import numbers
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, get_args

import trio

from pbkv.actors.agent import AgentActor
from pbkv.actors.engine import EngineActor
from pbkv.actors.events import (
    AgentFinished,
    AgentInvoked,
    CancelInvocation,
    InvocationDone,
    Invoke,
    PrefillDone,
    TerminationReason,
    WorkflowStarted,
    WorkflowTerminated,
)
from pbkv.actors.kvmanager import KVManagerActor
from pbkv.actors.predictor import PredictorActor, learns_agents
from pbkv.actors.workload import Segment, SegmentKind
from pbkv.engines.base import GREEDY, Engine, EngineError, GenerateResult, Sampling
from pbkv.kvmanager import KVManager, KVStatistics
from pbkv.live.chat import ChatFormat, IncrementalDecoder
from pbkv.predictor.base import Forecaster
from pbkv.runtime import (
    ActorRef,
    ActorStopped,
    ActorSystem,
    EventRecorder,
    now_s,
    open_actor_system,
)

Prompt = Sequence[Mapping[str, Any]] | Sequence[Segment] | str
"""What :meth:`WorkflowSession.call` takes: chat messages, raw segments or raw text."""

END_REASONS: tuple[TerminationReason, ...] = ("end", "aborted", "error", "recursion_limit")


class Overloaded(RuntimeError):
    """More calls are in flight than the runtime admits; retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CallFailed(EngineError):
    """The engine failed a call; ``step`` is the step to pass back when retrying it, and
    ``retryable`` false when retrying cannot help (the request never fits the GPU tier)."""

    def __init__(self, message: str, step: int, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.step = step
        self.retryable = retryable


class WorkflowEnded(RuntimeError):
    """A call was made on a workflow session that has already ended."""


@dataclass(frozen=True, slots=True)
class Simulated:
    """What an agent's reply is on an engine that samples no text (the sim engine).

    Args:
        text: the reply's text (routers parse it as they parse a real reply).
        output_tokens: the reply's length in tokens; the text is padded with filler to
            it (``0`` = the text's own length).
        token_ids: exact output ids instead of ``text`` (replays, bundled apps).
        gap_s: tool/think time before the call, in (virtual) seconds.
    """

    text: str = ""
    output_tokens: int = 0
    token_ids: tuple[int, ...] | None = None
    gap_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Reply:
    """What one call produced and what it cost.

    Attributes:
        agent / step: who answered, at which step of the workflow.
        text: the reply without its end-of-turn marker; ``token_ids`` all output ids.
        prompt_tokens: prompt length; ``cached_gpu_tokens`` / ``cached_host_tokens``
            served from each tier; ``computed_tokens`` prefilled.
        ttft_s / latency_s: submit to first token / to last token (runtime clock).
        finish_reason: ``stop`` (end-of-turn or a stop token) or ``length``.
    """

    agent: str
    step: int
    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    cached_gpu_tokens: int
    cached_host_tokens: int
    computed_tokens: int
    ttft_s: float
    latency_s: float
    finish_reason: str
    result: GenerateResult | None = None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from cache (GPU + host), as OpenAI's ``cached_tokens``."""
        return self.cached_gpu_tokens + self.cached_host_tokens


@dataclass(frozen=True, slots=True)
class Delta:
    """A streamed piece of a reply: new token ids and the text they complete."""

    token_ids: tuple[int, ...]
    text: str


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
costs ~12 KB, and a server's clients name agents freely)."""


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


class WorkflowSession:
    """One live workflow: its calls, its lifecycle events, its end.

    Made by :meth:`Runtime.open_workflow`. Calls may run concurrently (fan-out in a
    nursery); each is one step of the workflow.
    """

    def __init__(
        self,
        runtime: Runtime,
        workflow_id: str,
        app: str,
        task_id: str,
        task_text: str,
        tenant: str,
    ) -> None:
        self.runtime = runtime
        self.workflow_id = workflow_id
        self.app = app
        self.task_id = task_id
        self.task_text = task_text
        self.tenant = tenant
        self.replies: list[Reply] = []
        self.reason: TerminationReason | None = None
        self.start_s = now_s()
        self.end_s = math.nan
        self._steps = itertools.count()
        self._calls = itertools.count()  # invocation ids: two calls never share one
        self._agents: dict[str, None] = {}

    @property
    def agents(self) -> tuple[str, ...]:
        """The agents this workflow called, in order of first call."""
        return tuple(self._agents)

    @property
    def ended(self) -> bool:
        return self.reason is not None

    async def call(
        self,
        agent: str,
        prompt: Prompt,
        *,
        max_new_tokens: int = 256,
        sampling: Sampling = GREEDY,
        simulated: Simulated | None = None,
        context_tail: str = "",
        step: int | None = None,
        until: Callable[[int], bool] | None = None,
    ) -> Reply:
        """Call ``agent`` on ``prompt`` and return its reply.

        Args:
            agent: the agent's name (a node of the app's call graph).
            prompt: chat messages (templated message by message), raw ``Segment`` s,
                or raw text (one context segment, for plain completions).
            max_new_tokens: decode budget, >= 1.
            sampling: temperature / top-p / seed (greedy by default).
            simulated: the reply on an engine that samples no text (sim); real engines
                ignore it. Without it the sim emits ``max_new_tokens`` filler tokens.
            context_tail: the newest text in the context, for text-reading predictors.
            step: the step this call repeats (a retry after :class:`CallFailed`, whose
                ``step`` it is); default the workflow's next step.
            until: called with each output token id as the engine produces it (in the
                engine's step loop: it must not block); returning ``True`` ends the reply
                after that token, so a stop sequence ends decoding where it completes
                (``pbkv serve``'s ``stop``). An exception it raises ends the reply there
                too and is raised by this call; other calls run on. Engines that cannot
                end a request early (``trtllm``) never call it.

        Raises:
            ValueError / TypeError: bad arguments (named), checked before anything
                reaches the engine; ``PromptTooLong`` past the context.
            WorkflowEnded: the session has ended.
            Overloaded: too many calls in flight in the runtime.
            CallFailed: the engine failed the request (an ``EngineError``).
            Exception: what ``until`` raised (this call alone fails).
        """
        async with self.stream(
            agent,
            prompt,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            simulated=simulated,
            context_tail=context_tail,
            step=step,
            until=until,
            _stream=False,
        ) as stream:
            async for _ in stream:
                pass
        assert stream.reply is not None
        return stream.reply

    def stream(
        self,
        agent: str,
        prompt: Prompt,
        *,
        max_new_tokens: int = 256,
        sampling: Sampling = GREEDY,
        simulated: Simulated | None = None,
        context_tail: str = "",
        step: int | None = None,
        until: Callable[[int], bool] | None = None,
        _stream: bool = True,
    ) -> ReplyStream:
        """Call ``agent`` and stream its reply: ``async with wf.stream(...) as s``.

        Iterate ``s`` for :class:`Delta` s; ``s.reply`` is set once it is exhausted.
        Leaving the block early, or being cancelled, withdraws the request from the
        engine and releases its cache leases. Arguments and errors as :meth:`call`.
        """
        if self.ended:
            raise WorkflowEnded(f"workflow {self.workflow_id!r} has ended ({self.reason})")
        if not agent or not isinstance(agent, str):
            raise ValueError(f"agent must be a non-empty string, got {agent!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        _check_options(sampling, simulated, context_tail, step, until)
        segments = self._segments(prompt)
        prompt_tokens = sum(len(s.token_ids) for s in segments)
        if prompt_tokens == 0:
            raise ValueError("prompt is empty")
        scripted: tuple[int, ...] = ()
        if not self.runtime.samples_tokens:
            # refuse a reply too long for the context before building it: a client's
            # max_tokens of 2**31 would otherwise be allocated first
            self.runtime.chat.check_fits(prompt_tokens, _scripted_floor(simulated, max_new_tokens))
            scripted = scripted_output(self.runtime.chat, simulated, max_new_tokens)
            max_new_tokens = len(scripted)
        self.runtime.chat.check_fits(prompt_tokens, max_new_tokens)
        gap_s = (
            simulated.gap_s * self.runtime.gap_scale
            if simulated is not None and not self.runtime.samples_tokens
            else 0
        )
        return ReplyStream(
            self,
            agent,
            segments,
            scripted,
            max_new_tokens,
            sampling,
            gap_s,
            context_tail,
            _stream,
            step,
            until,
        )

    async def end(self, reason: TerminationReason = "end") -> None:
        """End the workflow: its private cache becomes retired (§4). Idempotent.

        Waits only on a running KV manager (its mailbox's room); once the runtime's KV
        manager has stopped, or was cancelled, the workflow ends at once.

        Raises:
            ValueError: ``reason`` is not one of ``end``, ``aborted``, ``error``,
                ``recursion_limit``.
        """
        if reason not in END_REASONS:
            raise ValueError(f"reason must be one of {END_REASONS}, got {reason!r}")
        if self.ended:
            return
        self.reason = reason
        self.end_s = now_s()
        self.runtime._ended_session(self, reason)
        # a stopped KV manager (the runtime shutting down, or cancelled) retires nothing
        # more: the workflow ends without waiting on it
        with trio.CancelScope(shield=True), contextlib.suppress(ActorStopped):
            await self.runtime._kv_manager.tell(
                WorkflowTerminated(self.workflow_id, reason, self.end_s)
            )

    def _segments(self, prompt: Prompt) -> tuple[Segment, ...]:
        chat = self.runtime.chat
        if isinstance(prompt, str):
            return (Segment("context", chat.encode(prompt)),)
        if not isinstance(prompt, Sequence) or not prompt:
            raise ValueError("prompt must be non-empty messages, segments or text")
        if all(isinstance(p, Segment) for p in prompt):
            return tuple(_checked_segment(i, p) for i, p in enumerate(prompt))
        return chat.segments(prompt)  # type: ignore[arg-type]


_SEGMENT_KINDS: tuple[str, ...] = get_args(SegmentKind)


def _check_options(
    sampling: object, simulated: object, context_tail: object, step: object, until: object
) -> None:
    """Refuse a call's options of the wrong type or range, naming the argument.

    Raises:
        TypeError / ValueError: the first bad one.
    """
    if not isinstance(sampling, Sampling):
        raise TypeError(
            f"sampling must be a pbkv.Sampling (e.g. pbkv.Sampling(temperature=0.7)), "
            f"got {type(sampling).__name__}"
        )
    if simulated is not None:
        _check_simulated(simulated)
    if not isinstance(context_tail, str):
        raise TypeError(f"context_tail must be a str, got {type(context_tail).__name__}")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int or None, got {step!r}")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
    if until is not None and not callable(until):
        raise TypeError(f"until must be callable or None, got {type(until).__name__}")


def _check_simulated(simulated: object) -> None:
    """Refuse a ``simulated`` reply that is not a well-formed :class:`Simulated`."""
    if not isinstance(simulated, Simulated):
        raise TypeError(
            f"simulated must be a pbkv.Simulated or None, got {type(simulated).__name__}"
        )
    if not isinstance(simulated.text, str):
        raise TypeError(f"simulated.text must be a str, got {type(simulated.text).__name__}")
    tokens = simulated.output_tokens
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise TypeError(f"simulated.output_tokens must be an int, got {tokens!r}")
    if tokens < 0:
        raise ValueError(f"simulated.output_tokens must be >= 0, got {tokens}")
    gap_s = simulated.gap_s
    if isinstance(gap_s, bool) or not isinstance(gap_s, numbers.Real):
        raise TypeError(f"simulated.gap_s must be a number of seconds, got {gap_s!r}")
    if not 0 <= gap_s < math.inf:
        raise ValueError(f"simulated.gap_s must be finite and >= 0, got {gap_s}")
    if simulated.token_ids is not None:
        _checked_token_ids("simulated.token_ids", simulated.token_ids)


def _checked_segment(index: int, segment: Any) -> Segment:
    """Return a caller's prompt segment with its ids as a tuple of ints, or refuse it."""
    if segment.kind not in _SEGMENT_KINDS:
        raise ValueError(
            f"prompt[{index}].kind must be one of {_SEGMENT_KINDS}, got {segment.kind!r}"
        )
    ids = _checked_token_ids(f"prompt[{index}].token_ids", segment.token_ids)
    return segment if ids is segment.token_ids else Segment(segment.kind, ids)


def _checked_token_ids(name: str, ids: Iterable[int]) -> tuple[int, ...]:
    """Return ``ids`` as a tuple of token ids (Python ints), or refuse them naming ``name``.

    A tuple of ints is returned as it is (no copy); lists and numpy integers are converted.

    Raises:
        TypeError: ``ids`` is text, a mapping or not iterable, or holds a non-integer
            (a ``bool`` included); the first such position is named.
        ValueError: an id is negative.
    """
    if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be a sequence of int token ids, got {type(ids).__name__}")
    checked = ids if type(ids) is tuple else tuple(ids)
    if not all(type(t) is int for t in checked):
        for i, t in enumerate(checked):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise TypeError(f"{name}[{i}] must be an int token id, got {t!r}")
        checked = tuple(int(t) for t in checked)
    if checked and min(checked) < 0:
        i = next(i for i, t in enumerate(checked) if t < 0)
        raise ValueError(f"{name}[{i}] must be >= 0, got {checked[i]}")
    return checked


def scripted_output(
    chat: ChatFormat, simulated: Simulated | None, max_new_tokens: int
) -> tuple[int, ...]:
    """Return the output ids the sim engine emits for a call.

    ``simulated.token_ids`` as given; else its text, padded with filler to its
    ``output_tokens`` (or to ``max_new_tokens`` without a simulated reply), then the
    end-of-turn marker.

    Raises:
        ValueError / TypeError: ``simulated.token_ids`` is empty or not token ids.
    """
    if simulated is not None and simulated.token_ids is not None:
        ids = _checked_token_ids("simulated.token_ids", simulated.token_ids)
        if not ids:
            raise ValueError("simulated.token_ids must not be empty")
        return ids
    text = simulated.text if simulated is not None else ""
    wanted = simulated.output_tokens if simulated is not None else max_new_tokens
    body = chat.encode(text) if text else ()
    stop = chat.encode(chat.stop_text)
    filler = max(0, wanted - len(body) - len(stop))
    return body + _filler_ids(chat) * filler + stop


def _scripted_floor(simulated: Simulated | None, max_new_tokens: int) -> int:
    """Return a length :func:`scripted_output` never goes below, without building it."""
    if simulated is None:
        return max_new_tokens
    if simulated.token_ids is not None:
        return len(simulated.token_ids)
    return simulated.output_tokens


def _filler_ids(chat: ChatFormat) -> tuple[int, ...]:
    ids = chat.encode(" .")
    return ids[-1:] if ids else (0,)


class ReplyStream:
    """An in-flight call: iterate it for :class:`Delta` s (see :meth:`WorkflowSession.stream`).

    Attributes:
        reply: the whole :class:`Reply`, once the stream is exhausted.
    """

    def __init__(
        self,
        session: WorkflowSession,
        agent: str,
        segments: tuple[Segment, ...],
        scripted: tuple[int, ...],
        max_new_tokens: int,
        sampling: Sampling,
        gap_s: float,
        context_tail: str,
        streaming: bool,
        step: int | None = None,
        until: Callable[[int], bool] | None = None,
    ) -> None:
        self.session = session
        self.agent = agent
        self.segments = segments
        self.scripted = scripted
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.gap_s = gap_s
        self.context_tail = context_tail
        self.streaming = streaming
        self.until = until
        self.reply: Reply | None = None
        self.step = -1
        self._retry_step = step
        self._tokens, self._receive = trio.open_memory_channel[int | InvocationDone](math.inf)
        self._decoder = IncrementalDecoder(session.runtime.chat.decode)
        self._invocation = ""
        self._agent_ref: ActorRef | None = None
        self._submitted = False
        self._finished = False
        self._text = ""
        self._text_ended = False
        self._until_error: Exception | None = None

    async def __aenter__(self) -> ReplyStream:
        rt = self.session.runtime
        if rt.calls_in_flight >= rt.max_calls_in_flight:
            raise Overloaded(
                f"{rt.calls_in_flight} calls in flight (limit {rt.max_calls_in_flight})"
            )
        if self.gap_s > 0:
            await trio.sleep(self.gap_s)
        rt.calls_in_flight += 1
        try:
            await self._submit()
        except BaseException:
            self._withdraw()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._withdraw()
        self._receive.close()

    def _withdraw(self) -> None:
        """Stop counting the call; cancel its request if the engine may still run it."""
        if self._finished:
            return
        self._finished = True
        self.session.runtime.calls_in_flight -= 1
        if self._submitted and self._agent_ref is not None:
            with contextlib.suppress(ActorStopped):  # it answered and was stopped as idle
                self._agent_ref.try_tell(CancelInvocation(self._invocation))

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> Delta:
        if self._finished:
            raise StopAsyncIteration
        tokens: list[int] = []
        item = await self._receive.receive()
        while True:
            if isinstance(item, InvocationDone):
                await self._done(item)
                if tokens:
                    return self._delta(tokens)
                raise StopAsyncIteration
            tokens.append(item)
            try:
                item = self._receive.receive_nowait()
            except trio.WouldBlock:
                return self._delta(tokens)

    def _delta(self, tokens: list[int]) -> Delta:
        """Return ``tokens`` as a delta; text stops at the end-of-turn marker."""
        text = "".join(self._decoder.push(t) for t in tokens)
        if self._text_ended:
            return Delta(tuple(tokens), "")
        stop = self.session.runtime.chat.stop_text
        self._text += text
        cut = self._text.find(stop)
        if cut >= 0:
            self._text_ended = True
            text = text[: max(0, len(text) - (len(self._text) - cut))]
        return Delta(tuple(tokens), text)

    async def _submit(self) -> None:
        session, rt = self.session, self.session.runtime
        self.step = next(session._steps) if self._retry_step is None else self._retry_step
        session._agents.setdefault(self.agent, None)
        # unique per call: two calls given one ``step`` (retries at once) are cancelled apart
        self._invocation = f"{session.workflow_id}/{self.step}#{next(session._calls)}"
        self._agent_ref = await rt._agent(self.agent)
        try:
            await self._invoke(session, rt, self._agent_ref)
        finally:
            rt._handed(self.agent)
        self._submitted = True

    async def _invoke(self, session: WorkflowSession, rt: Runtime, agent: ActorRef) -> None:
        """Tell the KV manager the agent is invoked, then hand the agent the invocation."""
        await rt._kv_manager.tell(
            AgentInvoked(
                session.workflow_id,
                self.step,
                self.agent,
                [len(s.token_ids) for s in self.segments],
                now_s(),
                self.context_tail,
            )
        )
        send = self._tokens
        on_token = self._on_token if self.streaming or self.until is not None else None
        await agent.tell(
            Invoke(
                session.workflow_id,
                self.step,
                self.agent,
                [s.token_ids for s in self.segments],
                self.scripted,
                session.tenant,
                reply_to=send,
                fixed_prefix_tokens=sum(
                    len(s.token_ids) for s in self.segments if s.kind != "context"
                ),
                max_new_tokens=self.max_new_tokens,
                sampling=self.sampling,
                on_token=on_token,
                invocation_id=self._invocation,
            )
        )

    def _on_token(self, token: int) -> bool:
        """Forward a streamed token; one the engine emits after the caller left is dropped.
        Return whether ``until`` ends the reply at this token.

        The engine calls this in its step loop, where raising would fail every request
        it runs: an exception ``until`` raises ends this reply at this token instead,
        and :meth:`_done` raises it to this call's caller alone.
        """
        if self.streaming:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                self._tokens.send_nowait(token)
        if self.until is None:
            return False
        try:
            return bool(self.until(token))
        except Exception as error:
            self._until_error = error
            return True

    async def _done(self, done: InvocationDone) -> None:
        self._finished = True
        session, rt = self.session, self.session.runtime
        rt.calls_in_flight -= 1
        if self._until_error is not None:
            raise self._until_error
        if done.error is not None:
            raise CallFailed(
                f"{self.agent} (step {self.step}): {done.error}",
                self.step,
                retryable=done.retryable,
            )
        result: GenerateResult = done.result
        at = now_s()
        hidden = None if result.hidden is None else result.hidden.tolist()
        await rt._kv_manager.tell(
            PrefillDone(
                session.workflow_id,
                self.step,
                result.cached_gpu_tokens,
                result.cached_host_tokens,
                result.computed_tokens,
                hidden,
                at,
            )
        )
        output = result.output_token_ids
        await rt._kv_manager.tell(
            AgentFinished(
                session.workflow_id,
                self.step,
                self.agent,
                len(output),
                result.e2e_s,
                at,
                result.ttft_s,
            )
        )
        text = rt.chat.reply_text(output)
        stopped = len(output) < self.max_new_tokens or text != rt.chat.decode(output)
        self.reply = Reply(
            agent=self.agent,
            step=self.step,
            text=text,
            token_ids=output,
            prompt_tokens=result.prompt_tokens,
            cached_gpu_tokens=result.cached_gpu_tokens,
            cached_host_tokens=result.cached_host_tokens,
            computed_tokens=result.computed_tokens,
            ttft_s=result.ttft_s,
            latency_s=result.e2e_s,
            finish_reason="stop" if stopped else "length",
            result=result,
        )
        session.replies.append(self.reply)


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
