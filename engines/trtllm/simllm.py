"""``SimLLM``: an ``LLM``-shaped engine in virtual time over the fake block manager.

TensorRT-LLM's executor as the adapter sees it, without a GPU: continuous batching
over the sim engine's roofline :class:`~pbkv.engines.sim.costmodel.CostModel` (the same
step times the owned-cache ``sim`` engine uses), with :class:`FakeBlockManager` as the
allocator. It speaks the slice of the LLM API the adapter calls, with upstream's
behaviour where it matters:

- ``generate_async(inputs, sampling_params, kv_cache_retention_config=..., cache_salt=...)``
  returns an output with ``aresult()`` and ``cached_tokens``
  (``tensorrt_llm/executor/result.py::GenerationResultBase``);
- KV events flow as upstream's do (``tensorrt_llm/executor/executor.py``, ``result.py``):
  the event queue (:class:`IterationResult`, at ``llm._executor._iter_kv_events_result``)
  exists only after the first ``generate_async``, before which
  ``get_kv_cache_events`` asserts; the engine flushes events into it once per iteration;
  ``get_kv_cache_events(timeout)`` reads until the queue is empty and then **latches
  done**, returning ``[]`` at once until the next ``generate_async`` calls
  ``mark_undone()``; ``get_kv_cache_events_async(timeout)`` returns that same object as
  an async iterator that waits up to ``timeout`` for each event and latches on timeout;
- with ``serializer_guards_none=False`` it plays the late-2025 ``_utils.py`` serializer,
  which cannot serialize an ``updated`` event with a None field: that iteration's events
  are lost (the consumer sees a gap in ``event_id``).

It also takes ``scripted_output_token_ids`` (a replay extension the adapter passes only
because this signature has it). Runs inside trio; ``run`` drives its scheduler.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.trtllm.api import LOCAL_API
from pbkv.engines.trtllm.fake import FakeBlockManager, KvCacheMetrics

__all__ = ["IterationResult", "SimLLM", "SimLLMConfig", "SimLLMStatistics"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SimLLMConfig:
    """Scheduler limits (``max_batch_size``, ``max_num_tokens`` per step upstream) and
    whether the event serializer survives a None field (fixed upstream 2026-02)."""

    max_batch_size: int = 64
    max_prefill_tokens: int = 8192
    serializer_guards_none: bool = True


class IterationResult:
    """The KV-event queue of ``tensorrt_llm/executor/result.py::IterationResult``.

    ``get_results`` reads until the queue is empty, then sets ``done``; while done it
    returns ``[]`` without reading, until ``mark_undone`` (called on every submit).
    Upstream's sync read also blocks up to ``timeout`` for more events; in virtual time
    that would stall the event loop, so here it never blocks. The async iterator waits
    up to ``timeout`` (virtual seconds) for each event and latches done on timeout.
    """

    def __init__(self) -> None:
        self._done = False
        self._timeout = 2.0
        self.queue: deque[dict[str, Any]] = deque()
        self._arrived = trio.Event()

    def set_timeout(self, timeout: float) -> None:
        self._timeout = timeout

    def mark_undone(self) -> None:
        self._done = False

    def put(self, events: list[dict[str, Any]]) -> None:
        """The executor's side: one iteration's events."""
        self.queue.extend(events)
        self._arrived.set()

    def get_results(self) -> list[dict[str, Any]]:
        if self._done:
            return []
        out = list(self.queue)
        self.queue.clear()
        self._done = True
        return out

    def __aiter__(self) -> IterationResult:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._done:
            raise StopAsyncIteration
        if not self.queue:
            with trio.move_on_after(self._timeout):
                while not self.queue:
                    self._arrived = trio.Event()
                    await self._arrived.wait()
            if not self.queue:
                self._done = True
                raise StopAsyncIteration
        return self.queue.popleft()


@dataclass(eq=False, slots=True)
class _Executor:
    """Where upstream keeps the event queue: ``llm._executor._iter_kv_events_result``."""

    _iter_kv_events_result: IterationResult | None = None


@dataclass(frozen=True, slots=True)
class TimingMetrics:
    """``request_perf_metrics.timing_metrics``, in engine-clock seconds."""

    arrival_time: float
    first_scheduled_time: float
    first_token_time: float
    last_token_time: float


@dataclass(frozen=True, slots=True)
class RequestPerfMetrics:
    kv_cache_metrics: KvCacheMetrics
    timing_metrics: TimingMetrics


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    """One finished sequence. ``onboarded_blocks`` (how many reused blocks came from
    host) is the fake's ground truth; the real output has no such field."""

    index: int
    token_ids: list[int]
    request_perf_metrics: RequestPerfMetrics | None
    onboarded_blocks: int = 0


@dataclass(frozen=True, slots=True)
class SimLLMStatistics:
    """Ground truth the real engine does not report per request (GPU vs host hits)."""

    requests: int
    prompt_tokens: int
    cached_gpu_tokens: int
    cached_host_tokens: int
    steps: int
    busy_s: float
    link_busy_s: float


@dataclass(eq=False)
class _Request:
    request_id: int
    prompt: list[int]
    output: list[int]
    retention: Any
    salt: str
    want_metrics: bool
    arrival_s: float
    done: trio.Event = field(default_factory=trio.Event)
    ready_s: float = 0.0
    scheduled_s: float = 0.0
    first_token_s: float = 0.0
    prefill_pos: int = 0
    generated: int = 0
    onboarded_blocks: int = 0
    cached_tokens: int = 0
    error: BaseException | None = None
    result: CompletionOutput | None = None


class RequestOutput:
    """What ``generate_async`` returns: await :meth:`aresult` for the finished output.

    ``cached_tokens``: prompt tokens matched in the cache at admission, partial blocks
    included (``GenerationResultBase.cached_tokens``).
    """

    def __init__(self, request: _Request) -> None:
        self._request = request
        self.request_id = request.request_id
        self.prompt_token_ids = request.prompt

    @property
    def cached_tokens(self) -> int:
        return self._request.cached_tokens

    @property
    def finished(self) -> bool:
        return self._request.done.is_set()

    @property
    def outputs(self) -> list[CompletionOutput]:
        return [] if self._request.result is None else [self._request.result]

    async def aresult(self) -> RequestOutput:
        """Wait until the request finishes; raise what failed it."""
        await self._request.done.wait()
        if self._request.error is not None:
            raise self._request.error
        return self


class SimLLM:
    """Virtual-time stand-in for ``tensorrt_llm.LLM`` (PyTorch backend, V1 KV manager).

    Args:
        manager: the block manager (its config plays ``KvCacheConfig``).
        cost: roofline cost model for step and host-link times.
        config: scheduler limits.
    """

    def __init__(
        self, manager: FakeBlockManager, cost: CostModel, config: SimLLMConfig | None = None
    ) -> None:
        self.manager = manager
        self.cost = cost
        self.config = config or SimLLMConfig()
        self.bytes_per_block = cost.kv_bytes_per_token * manager.tokens_per_block
        self.request_api = LOCAL_API
        self._executor = _Executor()
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._wake = trio.Event()
        self._ids = 0
        self.events_lost = 0
        self._link_free_s = 0.0
        self._stats = dict(requests=0, prompt=0, gpu=0, host=0, steps=0, busy=0.0, link=0.0)

    # -- the LLM API slice --------------------------------------------------------------

    def generate_async(
        self,
        inputs: Sequence[int],
        sampling_params: Any = None,
        *,
        kv_cache_retention_config: Any = None,
        cache_salt: str | None = None,
        scripted_output_token_ids: Sequence[int] = (),
    ) -> RequestOutput:
        """Queue one request of prompt token ids.

        Raises:
            ValueError: an empty prompt, ``max_tokens < 1``, or a request larger than
                the GPU pool.
        """
        max_tokens = getattr(sampling_params, "max_tokens", None) or 32
        prompt = list(inputs)
        if not prompt or max_tokens < 1:
            raise ValueError("generate_async needs a non-empty prompt and max_tokens >= 1")
        if self.manager.blocks_needed(len(prompt), max_tokens) > self.manager.num_blocks[0]:
            raise ValueError(
                f"request of {len(prompt)} + {max_tokens} tokens exceeds the GPU pool of "
                f"{self.manager.num_blocks[0]} blocks"
            )
        self._ids += 1
        scripted = list(scripted_output_token_ids)[:max_tokens]
        request = _Request(
            self._ids,
            prompt,
            scripted + [0] * (max_tokens - len(scripted)),
            kv_cache_retention_config,
            cache_salt or "",
            bool(getattr(sampling_params, "return_perf_metrics", False)),
            trio.current_time(),
        )
        self._waiting.append(request)
        self._wake.set()
        # executor.py::_maybe_initialize_iteration_results: the queue exists from the
        # first submit on, and every submit marks it undone.
        if self._executor._iter_kv_events_result is None:
            self._executor._iter_kv_events_result = IterationResult()
            self._forward_events()
        else:
            self._executor._iter_kv_events_result.mark_undone()
        return RequestOutput(request)

    def get_kv_cache_events(self, timeout: float = 2) -> list[dict[str, Any]]:
        """Return the queued KV events (``LLM.get_kv_cache_events``; never blocks here).

        Raises:
            AssertionError: before the first ``generate_async``, as upstream.
        """
        result = self._executor._iter_kv_events_result
        assert result is not None, "KV Event IterationResult is not properly instantiated."
        result.set_timeout(timeout)
        return result.get_results()

    def get_kv_cache_events_async(self, timeout: float = 2) -> IterationResult:
        """Return the event queue as an async iterator (``LLM.get_kv_cache_events_async``).

        Raises:
            AssertionError: before the first ``generate_async``, as upstream.
        """
        result = self._executor._iter_kv_events_result
        assert result is not None, "KV Event IterationResult is not properly instantiated."
        result.set_timeout(timeout)
        return result

    def _forward_events(self) -> None:
        """End an iteration: flush the manager's events to the queue (the worker's
        event thread), or lose them where the old serializer fails on a None field."""
        self.manager.flush_iteration_events()
        result = self._executor._iter_kv_events_result
        if result is None or not self.manager.pending_events:
            return  # kept in the engine's ring until the first request
        events = self.manager.get_latest_events()
        if not self.config.serializer_guards_none and any(_has_none_diff(e) for e in events):
            self.events_lost += len(events)
            log.warning(
                "KV events %d..%d lost: an updated event has a None field",
                events[0]["event_id"],
                events[-1]["event_id"],
            )
            return
        result.put(events)

    @property
    def num_active_requests(self) -> int:
        """Requests queued or running."""
        return len(self._waiting) + len(self._running)

    def statistics(self) -> SimLLMStatistics:
        s = self._stats
        return SimLLMStatistics(
            int(s["requests"]),
            int(s["prompt"]),
            int(s["gpu"]),
            int(s["host"]),
            int(s["steps"]),
            float(s["busy"]),
            float(s["link"]),
        )

    # -- scheduler --------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the executor loop until cancelled; queued requests then fail."""
        task_status.started()
        try:
            while True:
                await self._step()
        finally:
            for r in [*self._running, *self._waiting]:
                r.error = RuntimeError("executor stopped")
                r.done.set()

    async def _step(self) -> None:
        self._admit()
        now = trio.current_time()
        chunks = self._plan_prefill(now)
        decoding = [r for r in self._running if r.first_token_s and r.generated < len(r.output)]
        if not chunks and not decoding:
            pending = [r.ready_s for r in self._running if r.ready_s > now]
            with trio.move_on_at(min(pending, default=math.inf)):
                await self._wake.wait()
            self._wake = trio.Event()
            return
        kv_tokens = sum(len(r.prompt) + r.generated for r in decoding)
        step_s = self.cost.step_s([(n, r.prefill_pos) for r, n in chunks], len(decoding), kv_tokens)
        await trio.sleep(step_s)
        self._stats["steps"] += 1
        self._stats["busy"] += step_s
        self._advance(chunks, decoding)
        self._forward_events()  # events flush once per iteration

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.config.max_batch_size:
            r = self._waiting[0]
            if not self.manager.can_add(r.prompt, len(r.output), r.salt):
                return  # head-of-line, as the capacity scheduler's FCFS
            self._waiting.popleft()
            seq = self.manager.add_sequence(
                r.request_id, r.prompt, len(r.output), r.retention, r.salt
            )
            bs = self.manager.tokens_per_block
            cached = min(seq.cached_tokens, len(r.prompt) - 1)
            host = min(cached, seq.onboarded_blocks * bs)
            self._stats["requests"] += 1
            self._stats["prompt"] += len(r.prompt)
            self._stats["gpu"] += cached - host
            self._stats["host"] += host
            r.onboarded_blocks = seq.onboarded_blocks
            r.cached_tokens = seq.cached_tokens
            r.scheduled_s = r.ready_s = trio.current_time()
            if seq.onboarded_blocks:
                duration = self.cost.transfer_s(seq.onboarded_blocks * self.bytes_per_block)
                start = max(r.scheduled_s, self._link_free_s)
                self._link_free_s = r.ready_s = start + duration
                self._stats["link"] += duration
            r.prefill_pos = cached
            self._running.append(r)

    def _plan_prefill(self, now: float) -> list[tuple[_Request, int]]:
        budget = self.config.max_prefill_tokens
        chunks = []
        for r in self._running:
            remaining = len(r.prompt) - r.prefill_pos
            if budget <= 0:
                break
            if remaining <= 0 or r.ready_s > now:
                continue
            n = min(remaining, budget)
            chunks.append((r, n))
            budget -= n
        return chunks

    def _advance(self, chunks: list[tuple[_Request, int]], decoding: list[_Request]) -> None:
        """End an iteration as the executor does: blocks for the new tokens first (the
        next step's resources), then context blocks stored, then finished requests
        released, so evictions precede stores within an iteration's events."""
        now = trio.current_time()
        prefilled = []
        for r, n in chunks:
            r.prefill_pos += n
            if r.prefill_pos >= len(r.prompt):
                r.first_token_s = now
                self._emit_token(r)
                prefilled.append(r)
        for r in decoding:
            self._emit_token(r)
        for r in prefilled:
            self.manager.store_context_blocks(r.request_id)
        for r in [r for r in self._running if r.first_token_s and r.generated >= len(r.output)]:
            self._finish(r, now)

    def _emit_token(self, r: _Request) -> None:
        self.manager.add_token(r.request_id, r.output[r.generated])
        r.generated += 1

    def _finish(self, r: _Request, now: float) -> None:
        metrics = self.manager.remove_sequence(r.request_id)
        self._running.remove(r)
        perf = RequestPerfMetrics(
            metrics, TimingMetrics(r.arrival_s, r.scheduled_s, r.first_token_s, now)
        )
        r.result = CompletionOutput(
            0, list(r.output), perf if r.want_metrics else None, r.onboarded_blocks
        )
        r.done.set()


def _has_none_diff(event: dict[str, Any]) -> bool:
    data = event.get("data", {})
    return data.get("type") == "updated" and (
        data.get("cache_level") is None or data.get("priority") is None
    )
