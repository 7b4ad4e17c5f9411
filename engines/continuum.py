"""Continuum's admission: program-level FCFS, pinned programs first (§7.0).

Continuum (Li et al., arXiv 2511.02230, v6 §4.3; ``ContinuumRequestQueue`` in
``github.com/Hanchenli/vllm-continuum``, ``vllm/v1/core/sched/request_queue.py``) orders
the waiting queue by *program*, not by request: a request of a program whose KV is
pinned now (:class:`~pbkv.kvmanager.continuum.ContinuumTracker`) goes first, then
requests by their program's first arrival (a program's later turns go before newer
programs' first ones), then by their own arrival. As in vLLM's waiting loop, admission
stops at the first request that does not fit (head-of-line).

Under a policy without pins (``lru:continuum``) it is program-level FCFS alone. Batches
are balanced (stall-free, §7.0), as the ``workflow`` scheduler's, so batching is not
what tells the two apart.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

from pbkv.engines.admission import Running, Waiting, admission_of
from pbkv.engines.base import EngineError
from pbkv.engines.scheduler import note_waiting
from pbkv.kvmanager import Admission, KVManager
from pbkv.kvmanager.node import NO_WORKFLOW

E = TypeVar("E", bound=Waiting)
R = TypeVar("R", bound=Running)


class ContinuumScheduler:
    """Admit pinned programs' requests first, then in program order; never retracts.

    Args:
        balanced_prefill: ask the engine for stall-free batches.
    """

    name = "continuum"
    preempt = False

    def __init__(self, *, balanced_prefill: bool = True) -> None:
        self.balanced_prefill = balanced_prefill

    def rank(self, kv: KVManager, waiting: Sequence[E]) -> list[E]:
        """Return ``waiting`` in admission order. Does not modify the cache (it may give
        a workflow seen for the first time its start ordinal)."""
        pins = kv.continuum

        def key(entry: E) -> tuple[bool, int]:
            wid = entry.request.workflow_id
            pinned = pins is not None and pins.pinned(wid)
            return (not pinned, NO_WORKFLOW if wid is None else kv.scores.ordinal(wid))

        return sorted(waiting, key=key)  # stable: arrival order within a program

    def admit(
        self,
        kv: KVManager,
        waiting: deque[E],
        free_slots: int,
        *,
        on_admit: Callable[[E, Admission], None],
        on_reject: Callable[[E, EngineError], None],
        running: int = 0,
        prefill_share: float | None = None,
        retractable: Sequence[R] = (),
        on_retract: Callable[[R], None] | None = None,
    ) -> None:
        """Admit in :meth:`rank` order while slots remain; stop at the first request
        the GPU cannot hold now; reject one that can never fit and go on.

        Mutates: ``waiting`` and the KV manager.
        """
        note_waiting(kv, waiting)
        if not waiting or free_slots <= 0:
            return
        for entry in self.rank(kv, waiting):
            if free_slots <= 0:
                break
            try:
                admission = kv.try_admit(admission_of(entry))
            except ValueError as exc:
                waiting.remove(entry)
                on_reject(entry, EngineError(f"request {entry.request.request_id}: {exc}"))
                continue
            if admission is None:
                break
            waiting.remove(entry)
            free_slots -= 1
            on_admit(entry, admission)
