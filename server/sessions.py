"""Server sessions: hinted workflow ids mapped to open live workflows.

A session is a live workflow (``runtime.open_workflow``) that spans many HTTP requests.
It ends ("end") after a request marked final, once no request of it is in flight, or
when it has been idle for ``idle_timeout_s`` (its cache is then retired, as for any
ended workflow, §4). A request without a workflow id is a one-request workflow: opened
for it and ended after it ("end"; "aborted" when it failed or was cancelled).
Workflow ids are per tenant: the same id under two tenants names two workflows. The live
workflow's id (``live_id``, what the runtime, the KV manager and its statistics call it) is
``tenant/id``, or the id for the default tenant, made unique with ``#n`` when that is taken:
by another tenant's id (``cache_salt`` ``A`` with id ``x`` against id ``A/x``), or by the
same id's previous workflow, still finishing a request after one marked final.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec
import trio

from pbkv.runtime.clock import now_s
from pbkv.server.errors import APIError
from pbkv.server.hints import Hints

log = logging.getLogger(__name__)

APP = "serve"
_END_TIMEOUT_S = 30.0  # bound on ending a workflow from a cancelled or closing request


class WorkflowRecord(msgspec.Struct):
    """What the server saw of one workflow: its agents in call order, requests, state.

    ``workflow_id`` is the client's (``req-N`` for a one-request workflow), ``live_id`` the
    live workflow's (see the module docstring). ``state``: ``active``, ``final`` (ended
    after a request marked final), ``idle`` (retired by the idle timeout), ``single`` (a
    one-request workflow), ``closed`` (open at shutdown).
    """

    workflow_id: str
    tenant: str
    agents: list[str] = msgspec.field(default_factory=list)
    requests: int = 0
    state: str = "active"
    live_id: str = ""


class SessionStatistics(msgspec.Struct, frozen=True):
    """Counters of the session registry."""

    active: int
    in_flight_requests: int
    opened: int
    ended_final: int
    ended_idle: int
    single_request: int
    idle_timeout_s: float


class Lease(NamedTuple):
    """One request's hold on its workflow: the live workflow, how to settle it, and the
    workflow id the client knows it by (``x-pbkv-workflow-id``)."""

    workflow: Any  # pbkv.live.WorkflowSession
    settle: Callable[[], Awaitable[None]]
    workflow_id: str


async def _shielded(ending: Awaitable[None]) -> None:
    """Await a workflow's end even while cancelled (bounded by ``_END_TIMEOUT_S``)."""
    with trio.move_on_after(_END_TIMEOUT_S) as scope:
        scope.shield = True
        await ending
    if scope.cancelled_caught:
        log.warning("a workflow did not end within %ss", _END_TIMEOUT_S)


@dataclass(eq=False)
class _Session:
    workflow: Any  # the live workflow handle of pbkv.live
    record: WorkflowRecord
    last_used_s: float
    in_flight: int = 0
    final: bool = False
    ended: trio.Event = field(default_factory=trio.Event)


class SessionRegistry:
    """Open live workflows by (tenant, workflow id); retire idle ones.

    Args:
        runtime: the live runtime (``pbkv.open_runtime``).
        idle_timeout_s: a session with nothing in flight for this long is ended.
        max_sessions: open sessions at most; past it the least recently used idle session
            is ended, and with none idle the request is refused (429).
        recent_workflows: how many workflows :meth:`records` remembers (active and ended).
    """

    def __init__(
        self,
        runtime: Any,
        *,
        idle_timeout_s: float = 300.0,
        max_sessions: int = 4096,
        recent_workflows: int = 1024,
    ) -> None:
        if idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self._runtime = runtime
        self.idle_timeout_s = idle_timeout_s
        self._max_sessions = max_sessions
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._open_lock = trio.Lock()
        # by opening serial: an id reopened after its workflow ended is a second record
        self._records: collections.OrderedDict[int, WorkflowRecord] = collections.OrderedDict()
        self._recent = recent_workflows
        self._serial = itertools.count(1)  # one-request workflows' ids
        self._opening = itertools.count(1)  # records' keys, live ids' suffixes
        self._in_flight = 0
        self._opened = self._ended_final = self._ended_idle = self._single = 0

    @asynccontextmanager
    async def workflow(self, hints: Hints) -> AsyncIterator[Lease]:
        """Yield the live workflow of ``hints`` for one request, as a :class:`Lease`.

        Call ``await lease.settle()`` once the request has succeeded, before answering:
        a workflow that ends with this request (one-request, or marked final) ends then,
        so the client never sees a reply before its workflow's end. A request that
        fails or is cancelled ends a one-request workflow ``aborted`` and leaves a
        hinted one open.

        Raises:
            APIError: 429 when ``max_sessions`` sessions are open and none is idle.
        """
        self._in_flight += 1
        try:
            if hints.workflow_id is None:
                async with self._single_request(hints) as lease:
                    yield lease
            else:
                async with self._session_request(hints) as lease:
                    yield lease
        finally:
            self._in_flight -= 1

    @asynccontextmanager
    async def _single_request(self, hints: Hints) -> AsyncIterator[Lease]:
        workflow_id = f"req-{next(self._serial)}"
        while workflow_id in self._runtime.active_workflows():  # a client chose this id
            workflow_id = f"req-{next(self._serial)}"
        wf = await self._runtime.open_workflow(
            workflow_id=workflow_id, app=APP, tenant=hints.tenant
        )
        self._opened += 1
        self._single += 1
        record = WorkflowRecord(workflow_id, hints.tenant, [hints.agent], 1, "single")
        record.live_id = workflow_id
        self._remember(record)

        async def settle() -> None:
            await _shielded(wf.end("end"))

        try:
            yield Lease(wf, settle, workflow_id)
        finally:
            await _shielded(wf.end("aborted"))  # a no-op once settled: end is idempotent

    @asynccontextmanager
    async def _session_request(self, hints: Hints) -> AsyncIterator[Lease]:
        session = await self._acquire(hints)
        session.in_flight += 1
        session.record.requests += 1
        if not session.record.agents or session.record.agents[-1] != hints.agent:
            session.record.agents.append(hints.agent)

        async def settle() -> None:
            session.last_used_s = now_s()
            if hints.final and not session.final:
                session.final = True
                session.record.state = "final"
                if self._sessions.get(self._key(hints)) is session:
                    del self._sessions[self._key(hints)]
                self._ended_final += 1
            if session.final and session.in_flight == 1:
                await self._end(session, "end")

        try:
            yield Lease(session.workflow, settle, session.record.workflow_id)
        finally:
            session.in_flight -= 1
            session.last_used_s = now_s()
            if session.final and session.in_flight == 0:
                await self._end(session, "end")

    @staticmethod
    def _key(hints: Hints) -> tuple[str, str]:
        assert hints.workflow_id is not None
        return (hints.tenant, hints.workflow_id)

    async def _acquire(self, hints: Hints) -> _Session:
        key = self._key(hints)
        async with self._open_lock:
            session = self._sessions.get(key)
            if session is not None:
                return session
            if len(self._sessions) >= self._max_sessions:
                await self._evict_one()
            wid = hints.workflow_id
            assert wid is not None
            base = f"{hints.tenant}/{wid}" if hints.tenant else wid
            live_id, taken = base, set(self._runtime.active_workflows())
            while live_id in taken:
                live_id = f"{base}#{next(self._opening)}"
            wf = await self._runtime.open_workflow(
                workflow_id=live_id, app=APP, tenant=hints.tenant
            )
            record = WorkflowRecord(wid, hints.tenant, live_id=live_id)
            session = _Session(wf, record, last_used_s=now_s())
            self._sessions[key] = session
            self._opened += 1
            self._remember(record)
            return session

    async def _evict_one(self) -> None:
        idle = [(s.last_used_s, k) for k, s in self._sessions.items() if s.in_flight == 0]
        if not idle:
            raise APIError(
                429,
                f"{self._max_sessions} workflows are open and busy; retry later",
                type="rate_limit_error",
                code="too_many_workflows",
                retry_after_s=1,
            )
        _, key = min(idle)
        await self._retire(key)

    async def _retire(self, key: tuple[str, str]) -> None:
        session = self._sessions.pop(key)
        session.record.state = "idle"
        self._ended_idle += 1
        await self._end(session, "end")

    async def _end(self, session: _Session, reason: str) -> None:
        if session.ended.is_set():
            return
        session.ended.set()
        with trio.move_on_after(_END_TIMEOUT_S) as scope:
            scope.shield = True
            await session.workflow.end(reason)
        if scope.cancelled_caught:
            log.warning(
                "workflow %s did not end within %ss", session.record.live_id, _END_TIMEOUT_S
            )

    def _remember(self, record: WorkflowRecord) -> None:
        self._records[next(self._opening)] = record
        while len(self._records) > self._recent:
            self._records.popitem(last=False)

    async def retire_idle(self) -> int:
        """End every session idle for ``idle_timeout_s`` or longer; return how many."""
        deadline_s = now_s() - self.idle_timeout_s
        stale = [
            k for k, s in self._sessions.items() if s.in_flight == 0 and s.last_used_s <= deadline_s
        ]
        retired = 0
        for key in stale:
            session = self._sessions.get(key)  # a request may have taken it meanwhile
            if session is not None and session.in_flight == 0:
                await self._retire(key)
                retired += 1
        return retired

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Retire idle sessions until cancelled; then end every open session ("end")."""
        task_status.started()
        try:
            while True:
                await trio.sleep(min(self.idle_timeout_s / 4, 5.0))
                await self.retire_idle()
        finally:
            with trio.CancelScope(shield=True):
                await self.close()

    async def close(self) -> None:
        """End every open session (state ``closed``)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.record.state = "closed"
            await self._end(session, "end")

    def records(self) -> list[WorkflowRecord]:
        """Return the most recent workflows (up to ``recent_workflows``), oldest first."""
        return list(self._records.values())

    def statistics(self) -> SessionStatistics:
        """Return the registry's counters."""
        return SessionStatistics(
            active=len(self._sessions),
            in_flight_requests=self._in_flight,
            opened=self._opened,
            ended_final=self._ended_final,
            ended_idle=self._ended_idle,
            single_request=self._single,
            idle_timeout_s=self.idle_timeout_s,
        )
