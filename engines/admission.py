"""What the owned-cache engines' schedulers share (``sim``, ``torch``): the queued and
running requests they see, the KV manager's view of one, and admission in a given order."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple, Protocol, TypeVar

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


class ForwardCosts(NamedTuple):
    """What an engine's forwards cost now, as a scheduler weighs them (§7.0).

    Args:
        forward_s: seconds a decode forward costs whatever its rows (the weights' read,
            launches): what running a decode token in a forward of its own adds.
        prefill_token_s: marginal seconds of one prefill token (its compute): what
            recomputing one evicted token costs.
    """

    forward_s: float
    prefill_token_s: float


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


def admit_in_order(
    kv: KVManager,
    waiting: deque[E],
    order: Iterable[E],
    free_slots: int,
    *,
    on_admit: Callable[[E, Admission], None],
    on_reject: Callable[[E, EngineError], None],
) -> None:
    """Admit queued requests in ``order`` while batch slots remain.

    Stops at the first request the GPU cannot hold now (head-of-line, as vLLM's FCFS
    scheduler); a request that can never fit is rejected with an :class:`EngineError`
    and the next one is tried.

    Args:
        order: entries of ``waiting`` in the order to try them; ``waiting`` itself for
            arrival order.

    Mutates: ``waiting`` (admitted and rejected entries leave it) and the KV manager.
    """
    for entry in _heads(waiting) if order is waiting else order:
        if free_slots <= 0:
            return
        try:
            admission = kv.try_admit(admission_of(entry))
        except ValueError as exc:
            waiting.remove(entry)
            on_reject(entry, EngineError(f"request {entry.request.request_id}: {exc}"))
            continue
        if admission is None:
            return
        waiting.remove(entry)
        free_slots -= 1
        on_admit(entry, admission)


def _heads(waiting: deque[E]) -> Iterator[E]:
    """Yield the head of ``waiting`` while it has one (the caller takes each out)."""
    while waiting:
        yield waiting[0]
