"""``SimLLM``: an ``LLM``-shaped engine in virtual time over the fake block manager.

TensorRT-LLM's executor as the adapter sees it, without a GPU: continuous batching
over the sim engine's roofline :class:`~pbkv.engines.sim.costmodel.CostModel` (the same
step times the owned-cache ``sim`` engine uses), with :class:`FakeBlockManager` as the
allocator. It speaks the slice of the LLM API the adapter calls:
``generate_async(inputs, sampling_params, kv_cache_retention_config=..., cache_salt=...)``
returning an output with ``aresult()``, and ``get_kv_cache_events_async(timeout)``.
It also takes ``scripted_output_token_ids`` (a replay extension the adapter passes only
because this signature has it). Runs inside trio; ``run`` drives its scheduler.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.trtllm.fake import FakeBlockManager, KvCacheMetrics, prompt_block_hashes

__all__ = ["SimLLM", "SimLLMConfig", "SimLLMStatistics"]


@dataclass(frozen=True, slots=True)
class SimLLMConfig:
    """Scheduler limits (``max_batch_size``, ``max_num_tokens`` per step upstream)."""

    max_batch_size: int = 64
    max_prefill_tokens: int = 8192


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
    hashes: list[int]
    done: trio.Event = field(default_factory=trio.Event)
    ready_s: float = 0.0
    scheduled_s: float = 0.0
    first_token_s: float = 0.0
    prefill_pos: int = 0
    generated: int = 0
    onboarded_blocks: int = 0
    error: BaseException | None = None
    result: CompletionOutput | None = None


class RequestOutput:
    """What ``generate_async`` returns: await :meth:`aresult` for the finished output."""

    def __init__(self, request: _Request) -> None:
        self._request = request
        self.request_id = request.request_id
        self.prompt_token_ids = request.prompt

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
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._wake = trio.Event()
        self._events_ready = trio.Event()
        self._ids = 0
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
            prompt_block_hashes(prompt, self.manager.tokens_per_block, cache_salt or ""),
        )
        self._waiting.append(request)
        self._wake.set()
        return RequestOutput(request)

    async def get_kv_cache_events_async(self, timeout: float = 2) -> AsyncIterator[dict[str, Any]]:
        """Yield the buffered KV events; wait up to ``timeout`` seconds when there are none."""
        if not self.manager.pending_events:
            with trio.move_on_after(timeout):
                await self._events_ready.wait()
        self._events_ready = trio.Event()
        for event in self.manager.get_latest_events():
            yield event

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
        if self.manager.pending_events:
            self._events_ready.set()  # events flush once per iteration

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.config.max_batch_size:
            r = self._waiting[0]
            if not self.manager.can_add(r.prompt, len(r.output), r.salt, r.hashes):
                return  # head-of-line, as the capacity scheduler's FCFS
            self._waiting.popleft()
            seq = self.manager.add_sequence(
                r.request_id, r.prompt, len(r.output), r.retention, r.salt, r.hashes
            )
            bs = self.manager.tokens_per_block
            reused = seq.metrics.num_reused_blocks
            self._stats["requests"] += 1
            self._stats["prompt"] += len(r.prompt)
            self._stats["gpu"] += (reused - seq.onboarded_blocks) * bs
            self._stats["host"] += seq.onboarded_blocks * bs
            r.onboarded_blocks = seq.onboarded_blocks
            r.scheduled_s = r.ready_s = trio.current_time()
            if seq.onboarded_blocks:
                duration = self.cost.transfer_s(seq.onboarded_blocks * self.bytes_per_block)
                start = max(r.scheduled_s, self._link_free_s)
                self._link_free_s = r.ready_s = start + duration
                self._stats["link"] += duration
            r.prefill_pos = min(reused * bs, len(r.prompt) - 1)
            self._running.append(r)
        if self.manager.pending_events:
            self._events_ready.set()

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
        now = trio.current_time()
        for r, n in chunks:
            r.prefill_pos += n
            if r.prefill_pos >= len(r.prompt):
                self.manager.store_context_blocks(r.request_id)
                r.first_token_s = now
                self._emit_token(r)
        for r in decoding:
            self._emit_token(r)
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
