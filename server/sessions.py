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
import logging
import math
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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
_MIN_SWEEP_S = 0.05  # the idle sweep never spins, however short the idle timeout


def _single_id() -> str:
    """Return a fresh one-request workflow id (random: it tells no one how many requests
    anyone made)."""
    return f"req-{secrets.token_hex(8)}"


class WorkflowRecord(msgspec.Struct):
    """What the server saw of one workflow: its agents in call order, requests, state.

    ``workflow_id`` is the client's (``req-`` and 16 random hex digits for a one-request
    workflow: no count of anyone's requests can be read from it), ``live_id`` the
    live workflow's (see the module docstring). ``state``: ``active``, ``final`` (ended
    after a request marked final), ``ended`` (ended by the client without a request:
    ``POST /v1/pbkv/workflows/{id}/end``, a framework's run-end hook), ``idle`` (retired
    by the idle timeout), ``single`` (a one-request workflow), ``closed`` (open at
    shutdown).
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
    ended_by_client: int = 0  # POST /v1/pbkv/workflows/{id}/end


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
    account: str  # Hints.account: what per-tenant limits count
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
            of the tenant (``Hints.account``) holding the most is ended, so a tenant
            within its share keeps its workflows; with none idle the request is refused
            (429).
        max_sessions_per_tenant: open sessions of one tenant at most; past it that
            tenant's least recently used idle session is ended, and with none idle its
            request is refused (429). Another tenant's sessions are never touched.
        recent_workflows: how many workflows :meth:`records` remembers (active and ended).
    """

    def __init__(
        self,
        runtime: Any,
        *,
        idle_timeout_s: float = 300.0,
        max_sessions: int = 4096,
        max_sessions_per_tenant: int = 1024,
        recent_workflows: int = 1024,
    ) -> None:
        if not (idle_timeout_s > 0 and math.isfinite(idle_timeout_s)):
            raise ValueError(f"idle_timeout_s must be a finite number > 0, got {idle_timeout_s}")
        for name, value in (
            ("max_sessions", max_sessions),
            ("max_sessions_per_tenant", max_sessions_per_tenant),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self._runtime = runtime
        self.idle_timeout_s = idle_timeout_s
        self._max_sessions = max_sessions
        self._max_per_tenant = max_sessions_per_tenant
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._by_account: collections.Counter[str] = collections.Counter()
        self._open_lock = trio.Lock()
        # by opening serial: an id reopened after its workflow ended is a second record
        self._records: collections.OrderedDict[int, WorkflowRecord] = collections.OrderedDict()
        self._recent = recent_workflows
        self._serial = 0  # records' keys
        self._in_flight = 0
        self._opened = self._ended_final = self._ended_idle = self._single = 0
        self._ended_by_client = 0

    @asynccontextmanager
    async def workflow(self, hints: Hints) -> AsyncIterator[Lease]:
        """Yield the live workflow of ``hints`` for one request, as a :class:`Lease`.

        Call ``await lease.settle()`` once the request has succeeded, before answering:
        a workflow that ends with this request (one-request, or marked final) ends then,
        so the client never sees a reply before its workflow's end. A request that
        fails or is cancelled ends a one-request workflow ``aborted`` and leaves a
        hinted one open.

        Raises:
            APIError: 429 when the tenant's ``max_sessions_per_tenant`` sessions are open
                and none is idle, or ``max_sessions`` are and no tenant has one idle.
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
        workflow_id = _single_id()
        while workflow_id in self._runtime.active_workflows():  # a client chose this id
            workflow_id = _single_id()
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
                    self._forget(self._key(hints))
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
            if self._by_account[hints.account] >= self._max_per_tenant:
                await self._evict_one(
                    (hints.account,), f"{self._max_per_tenant} workflows of this tenant"
                )
            elif len(self._sessions) >= self._max_sessions:
                largest = [a for a, _ in self._by_account.most_common()]
                await self._evict_one(largest, f"{self._max_sessions} workflows")
            wid = hints.workflow_id
            assert wid is not None
            base = f"{hints.tenant}/{wid}" if hints.tenant else wid
            live_id, taken, suffix = base, set(self._runtime.active_workflows()), 1
            while live_id in taken:
                suffix += 1
                live_id = f"{base}#{suffix}"
            wf = await self._runtime.open_workflow(
                workflow_id=live_id, app=APP, tenant=hints.tenant
            )
            record = WorkflowRecord(wid, hints.tenant, live_id=live_id)
            session = _Session(wf, record, hints.account, last_used_s=now_s())
            self._sessions[key] = session
            self._by_account[hints.account] += 1
            self._opened += 1
            self._remember(record)
            return session

    async def _evict_one(self, accounts: Sequence[str], full: str) -> None:
        """End the least recently used idle session of the first of ``accounts`` that
        has one.

        Raises:
            APIError: 429 (``full`` says what is full) when none of them has one.
        """
        for account in accounts:
            idle = [
                (s.last_used_s, k)
                for k, s in self._sessions.items()
                if s.account == account and s.in_flight == 0
            ]
            if idle:
                await self._retire(min(idle)[1])
                return
        raise APIError(
            429,
            f"{full} are open and busy; retry later",
            type="rate_limit_error",
            code="too_many_workflows",
            retry_after_s=1,
        )

    def _forget(self, key: tuple[str, str]) -> _Session:
        """Remove an open session from the registry (it is not ended here)."""
        session = self._sessions.pop(key)
        self._by_account[session.account] -= 1
        if not self._by_account[session.account]:
            del self._by_account[session.account]
        return session

    async def _retire(self, key: tuple[str, str]) -> None:
        session = self._forget(key)
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
        self._serial += 1
        self._records[self._serial] = record
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
                await trio.sleep(max(min(self.idle_timeout_s / 4, 5.0), _MIN_SWEEP_S))
                await self.retire_idle()
        finally:
            with trio.CancelScope(shield=True):
                await self.close(_END_TIMEOUT_S)

    async def end_workflow(self, hints: Hints) -> WorkflowRecord | None:
        """End the open workflow ``hints`` names without a request (state ``ended``);
        with requests in flight it ends once the last has finished (before its reply,
        as a request marked final). The id then opens a new workflow.

        Returns:
            Its record, or ``None`` when no workflow of that id is open for the tenant.

        Mutates: the registry (the session is forgotten), the runtime (its end).
        """
        key = self._key(hints)
        session = self._sessions.get(key)
        if session is None:
            return None
        self._forget(key)
        session.final = True
        session.record.state = "ended"
        self._ended_by_client += 1
        if session.in_flight == 0:
            await self._end(session, "end")
        return session.record

    async def close(self, timeout_s: float = math.inf) -> int:
        """End every open session (state ``closed``), for ``timeout_s`` at most.

        Sessions not ended by then are left to the runtime, which ends what is still
        open when it closes.

        Returns:
            How many sessions were ended.
        """
        sessions, self._sessions = list(self._sessions.values()), {}
        self._by_account.clear()
        for session in sessions:
            session.record.state = "closed"
        ended = 0
        with trio.move_on_after(timeout_s) as scope:
            for session in sessions:
                if not session.ended.is_set():
                    session.ended.set()
                    await session.workflow.end("end")
                ended += 1
        if scope.cancelled_caught:
            log.warning(
                "%d of %d workflows not ended within %ss at shutdown; the runtime ends them",
                len(sessions) - ended,
                len(sessions),
                timeout_s,
            )
        return ended

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
            ended_by_client=self._ended_by_client,
        )
