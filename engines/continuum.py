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
from typing import TypeVar

from pbkv.engines.admission import Waiting
from pbkv.engines.ranked import FCFSScheduler
from pbkv.kvmanager import KVManager
from pbkv.kvmanager.node import NO_WORKFLOW

E = TypeVar("E", bound=Waiting)


class ContinuumScheduler(FCFSScheduler):
    """Admit pinned programs' requests first, then in program order, head-of-line (as
    :class:`~pbkv.engines.ranked.FCFSScheduler` admits); never retracts.

    Args:
        balanced_prefill: ask the engine for stall-free batches.
    """

    name = "continuum"

    def __init__(self, *, balanced_prefill: bool = True) -> None:
        super().__init__(balanced_prefill=balanced_prefill)

    def rank(self, kv: KVManager, waiting: deque[E]) -> list[E]:
        """Return ``waiting`` in admission order. Does not modify the cache (it may give
        a workflow seen for the first time its start ordinal)."""
        pins = kv.continuum

        def key(entry: E) -> tuple[bool, int]:
            wid = entry.request.workflow_id
            pinned = pins is not None and pins.pinned(wid)
            return (not pinned, NO_WORKFLOW if wid is None else kv.scores.ordinal(wid))

        return sorted(waiting, key=key)  # stable: arrival order within a program
