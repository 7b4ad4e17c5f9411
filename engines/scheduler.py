"""Admission schedulers for the owned-cache engines: which queued request goes next (§7.0).

Under load the queue decides as much as eviction does, so admission is part of the
policy. Three schedulers, by name:

- ``fcfs``: arrival order, head-of-line blocking (SGLang's and vLLM's default).
- ``lpm``: longest cached prefix first (SGLang's ``lpm``), arrival order on ties.
- ``workflow``: pbkv's: the oldest workflow first (a workflow's age is when its first
  request reached the engine), with a request whose prompt is mostly cached or loading
  moved ahead of those that would recompute most of theirs.

``lpm`` and ``workflow`` try requests past one that does not fit (bypass), but a request
overtaken ``max_bypass`` times goes first, and while it does not fit nothing behind it
is admitted, so no request starves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from pbkv.engines.admission import Waiting, admit_fcfs, admit_request
from pbkv.engines.base import EngineError
from pbkv.kvmanager import Admission, KVManager

E = TypeVar("E", bound=Waiting)

DEFAULT_MAX_BYPASS = 32
"""Times a queued request may be overtaken before it blocks everything behind it."""


class Scheduler(Protocol):
    """Admits queued requests through the KV manager while batch slots remain."""

    name: str

    def admit(
        self,
        kv: KVManager,
        waiting: deque[E],
        free_slots: int,
        *,
        on_admit: Callable[[E, Admission], None],
        on_reject: Callable[[E, EngineError], None],
    ) -> None:
        """Admit what fits, in the scheduler's order.

        Mutates: ``waiting`` (admitted and rejected entries leave it) and the KV manager.
        """
        ...


class FCFSScheduler:
    """Arrival order; stop at the first request that does not fit (see :func:`admit_fcfs`)."""

    name = "fcfs"

    def admit(
        self,
        kv: KVManager,
        waiting: deque[E],
        free_slots: int,
        *,
        on_admit: Callable[[E, Admission], None],
        on_reject: Callable[[E, EngineError], None],
    ) -> None:
        admit_fcfs(kv, waiting, free_slots, on_admit=on_admit, on_reject=on_reject)


class _RankedScheduler:
    """Admit in :meth:`rank` order with bounded bypass.

    Args:
        max_bypass: times a request may be overtaken by a later arrival before it goes
            first and blocks the queue behind it until it fits, >= 0.

    Raises:
        ValueError: negative ``max_bypass``.
    """

    name = ""

    def __init__(self, max_bypass: int = DEFAULT_MAX_BYPASS) -> None:
        if max_bypass < 0:
            raise ValueError(f"max_bypass must be >= 0, got {max_bypass}")
        self.max_bypass = max_bypass
        self._bypassed: dict[int, int] = {}  # id(entry) -> times overtaken

    def rank(self, kv: KVManager, waiting: Sequence[E]) -> list[E]:
        """Return ``waiting`` in admission order (best first). Does not modify the cache."""
        raise NotImplementedError

    def admit(
        self,
        kv: KVManager,
        waiting: deque[E],
        free_slots: int,
        *,
        on_admit: Callable[[E, Admission], None],
        on_reject: Callable[[E, EngineError], None],
    ) -> None:
        if not waiting or free_slots <= 0:
            return
        live = {id(e) for e in waiting}
        self._bypassed = {k: n for k, n in self._bypassed.items() if k in live}
        arrival = {id(e): i for i, e in enumerate(waiting)}
        starving = [e for e in waiting if self._bypassed.get(id(e), 0) >= self.max_bypass]
        rest = [e for e in self.rank(kv, waiting) if id(e) not in {id(s) for s in starving}]
        admitted: list[E] = []
        for entry in [*starving, *rest]:
            if free_slots <= 0:
                break
            try:
                admission = kv.try_admit(admit_request(entry.request, entry.keys))
            except ValueError as exc:
                waiting.remove(entry)
                on_reject(entry, EngineError(f"request {entry.request.request_id}: {exc}"))
                continue
            if admission is None:
                if self._bypassed.get(id(entry), 0) >= self.max_bypass:
                    break  # it goes next: keep what frees up for it
                continue
            waiting.remove(entry)
            free_slots -= 1
            admitted.append(entry)
            on_admit(entry, admission)
        self._count_bypasses(waiting, admitted, arrival)

    def _count_bypasses(
        self, waiting: Sequence[E], admitted: Sequence[E], arrival: dict[int, int]
    ) -> None:
        """Charge each still-waiting request once per later arrival admitted before it."""
        if not admitted:
            return
        for entry in waiting:
            mine = arrival.get(id(entry))
            if mine is None:
                continue
            later = sum(arrival[id(a)] > mine for a in admitted)
            if later:
                self._bypassed[id(entry)] = self._bypassed.get(id(entry), 0) + later


class LPMScheduler(_RankedScheduler):
    """Longest cached prefix (GPU, host or loading) first; arrival order on ties."""

    name = "lpm"

    def rank(self, kv: KVManager, waiting: Sequence[E]) -> list[E]:
        def cached(entry: E) -> int:
            gpu, host = kv.tree.peek_prefix(entry.keys, entry.request.namespace)
            return gpu + host

        return sorted(waiting, key=lambda e: -cached(e))  # stable: arrival order on ties


class WorkflowScheduler(_RankedScheduler):
    """Oldest workflow first; a mostly cached request ahead of one that mostly recomputes.

    A request's *value* is the share of its prompt cached or loading. Requests are
    ranked by value band (``value_bands`` equal bands, the top band first), then by
    workflow age (first request seen by the engine), then arrival. ``value_bands=1``
    ranks by age alone.

    Args:
        max_bypass: see :class:`_RankedScheduler`.
        value_bands: bands of the cached share, >= 1.

    Raises:
        ValueError: ``value_bands < 1`` or negative ``max_bypass``.
    """

    name = "workflow"

    def __init__(self, max_bypass: int = DEFAULT_MAX_BYPASS, value_bands: int = 2) -> None:
        super().__init__(max_bypass)
        if value_bands < 1:
            raise ValueError(f"value_bands must be >= 1, got {value_bands}")
        self.value_bands = value_bands
        self._first_seen: dict[str, int] = {}

    def rank(self, kv: KVManager, waiting: Sequence[E]) -> list[E]:
        bs = kv.config.block_size

        def key(entry: E) -> tuple[int, int]:
            request = entry.request
            wid = request.workflow_id or f"\0{request.request_id}"
            age = self._first_seen.setdefault(wid, len(self._first_seen))
            gpu, host = kv.tree.peek_prefix(entry.keys, request.namespace)
            share = (gpu + host) * bs / max(1, len(request.prompt_token_ids))
            band = min(self.value_bands - 1, int(share * self.value_bands))
            return -band, age

        return sorted(waiting, key=key)


SCHEDULERS: dict[str, Callable[[], Scheduler]] = {
    "fcfs": FCFSScheduler,
    "lpm": LPMScheduler,
    "workflow": WorkflowScheduler,
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
