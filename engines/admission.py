"""FCFS admission shared by the owned-cache engines (``sim``, ``torch``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeVar

from pbkv.engines.base import EngineError, GenerateRequest
from pbkv.kvmanager import Admission, AdmitRequest, KVManager


class Waiting(Protocol):
    """A queued request: what it asks for, its prompt's block keys, and how many times
    it was retracted (``> 0``: ``request`` resumes it, prompt = its prompt plus the
    tokens it had generated)."""

    request: GenerateRequest
    keys: list[int]
    retractions: int


class Running(Waiting, Protocol):
    """A running request: a queued one plus its hold on the cache."""

    admission: Admission | None


E = TypeVar("E", bound=Waiting)


def admit_request(
    request: GenerateRequest, keys: list[int], *, resumed: bool = False
) -> AdmitRequest:
    """Return the KV manager's view of an engine request (``resumed``: a retracted
    request coming back, see :attr:`AdmitRequest.resumed`)."""
    return AdmitRequest(
        keys=keys,
        prompt_tokens=len(request.prompt_token_ids),
        max_new_tokens=request.max_new_tokens,
        workflow_id=request.workflow_id,
        agent=request.agent,
        namespace=request.namespace,
        fixed_prefix_tokens=request.fixed_prefix_tokens,
        resumed=resumed,
    )


def admission_of(entry: Waiting) -> AdmitRequest:
    """Return the KV manager's view of a queued entry (a resumption if it was retracted)."""
    return admit_request(entry.request, entry.keys, resumed=entry.retractions > 0)


def admit_fcfs(
    kv: KVManager,
    waiting: deque[E],
    free_slots: int,
    *,
    on_admit: Callable[[E, Admission], None],
    on_reject: Callable[[E, EngineError], None],
) -> None:
    """Admit queued requests in arrival order while batch slots remain.

    Stops at the first request the GPU cannot hold now (head-of-line, as vLLM's FCFS
    scheduler); a request that can never fit is rejected with an :class:`EngineError`
    and the next one is tried.

    Mutates: ``waiting`` (admitted and rejected entries leave it) and the KV manager.
    """
    while waiting and free_slots > 0:
        entry = waiting[0]
        try:
            admission = kv.try_admit(admission_of(entry))
        except ValueError as exc:
            waiting.popleft()
            on_reject(entry, EngineError(f"request {entry.request.request_id}: {exc}"))
            continue
        if admission is None:
            return
        waiting.popleft()
        free_slots -= 1
        on_admit(entry, admission)
