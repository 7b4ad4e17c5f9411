"""Reading TensorRT-LLM's KV events without blocking, spinning or starving (§7.3).

Plain synchronous code. Upstream's event API (``tensorrt_llm/llmapi/llm.py``
``get_kv_cache_events``/``get_kv_cache_events_async``, backed by
``tensorrt_llm/executor/executor.py::get_kv_events`` and
``tensorrt_llm/executor/result.py::IterationResult``) has four traps:

- before the first ``generate_async`` the event queue does not exist and the call
  asserts ("KV Event IterationResult is not properly instantiated");
- ``get_kv_cache_events(timeout)`` reads until ``timeout`` passes with no event: under
  steady load it does not return (the consumer starves);
- once it has timed out it latches *done* and returns ``[]`` at once, without reading,
  until the next ``generate_async`` calls ``mark_undone()``: a loop around it spins, and
  events that arrive in between wait for the next request;
- the async variant needs the queue to have been created on a running asyncio loop.

:func:`poll_kv_events` uses the sync call correctly: nothing before the first request,
then ``mark_undone()`` and ``get_kv_cache_events(timeout=0)``, which drains what is
queued now and returns. The caller (the adapter's pump) sleeps between polls.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def kv_event_queue(llm: Any) -> Any | None:
    """Return the engine's KV-event queue (``llm._executor._iter_kv_events_result``),
    or ``None`` while no request has been submitted. Does not modify the engine."""
    executor = getattr(llm, "_executor", None)
    return getattr(executor, "_iter_kv_events_result", None)


def poll_kv_events(llm: Any) -> list[dict[str, Any]]:
    """Return the KV events queued now, without waiting; ``[]`` before the first request.

    Args:
        llm: ``tensorrt_llm.LLM`` (or a wrapper exposing its ``_executor`` and
            ``get_kv_cache_events``), or :class:`~pbkv.engines.trtllm.SimLLM`.

    Mutates: drains the engine's event queue.
    """
    queue = kv_event_queue(llm)
    if queue is None:
        if getattr(llm, "_executor", None) is None:
            raise TypeError(
                f"{type(llm).__name__} has no _executor: cannot read its KV events without "
                "blocking (tensorrt_llm.LLM and SimLLM have one)"
            )
        return []
    queue.mark_undone()  # lift the latch: this read really reads
    return list(llm.get_kv_cache_events(timeout=0))
