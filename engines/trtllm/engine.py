"""The TensorRT-LLM adapter: an engine over an ``LLM``-shaped object (§7.3).

``generate`` sends ``generate_async(prompt_token_ids, SamplingParams(max_tokens=...,
return_perf_metrics=True), kv_cache_retention_config=..., cache_salt=tenant)`` and fills
the result from ``request_perf_metrics.kv_cache_metrics`` (reused blocks → cached
tokens). Which optional arguments exist is read from ``generate_async``'s signature, not
assumed. ``run`` pumps ``get_kv_cache_events_async`` into the mirror and issues touch
requests (re-tag, prefetch) in idle capacity. The object may be ``tensorrt_llm.LLM``
(through :class:`pbkv.engines.trtllm.real.ThreadedLLM`) or the virtual-time
:class:`~pbkv.engines.trtllm.simllm.SimLLM`; nothing here imports ``tensorrt_llm``.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from pbkv.engines.base import EngineError, GenerateRequest, GenerateResult
from pbkv.engines.trtllm.api import Api, load_api
from pbkv.engines.trtllm.fake import prompt_block_hashes
from pbkv.engines.trtllm.mirror import HOST, MirrorStatistics
from pbkv.engines.trtllm.steering import MirrorKV, Touch, retention_config

log = logging.getLogger(__name__)

#: ``generate_async`` keywords the adapter passes only where the signature has them.
OPTIONAL_ARGUMENTS = ("kv_cache_retention_config", "cache_salt", "scripted_output_token_ids")

Hasher = Callable[[Sequence[int], int, str], list[int]]


def optional_arguments(generate_async: Callable[..., Any]) -> frozenset[str]:
    """Return which of :data:`OPTIONAL_ARGUMENTS` ``generate_async`` accepts by name.

    A ``**kwargs`` catch-all counts for the documented two (retention config, salt),
    never for the replay extension. An unreadable signature accepts none.
    """
    try:
        params = inspect.signature(generate_async).parameters
    except (TypeError, ValueError):
        log.warning(
            "cannot read the signature of %r; sending no optional arguments", generate_async
        )
        return frozenset()
    named = {n for n in OPTIONAL_ARGUMENTS if n in params}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        named |= {"kv_cache_retention_config", "cache_salt"}
    return frozenset(named)


@dataclass(frozen=True, slots=True)
class TrtllmEngineConfig:
    """Adapter settings.

    Args:
        tokens_per_block: the engine's ``KvCacheConfig.tokens_per_block``.
        max_batch_size: the engine's batch limit; touches run only below it.
        max_touches_in_flight: touch requests at once.
        event_timeout_s: ``get_kv_cache_events_async`` timeout per poll.
    """

    tokens_per_block: int = 32
    max_batch_size: int = 64
    max_touches_in_flight: int = 2
    event_timeout_s: float = 2.0


@dataclass(frozen=True, slots=True)
class TrtllmStatistics:
    """What the adapter did: requests, retention configs, touches, and the mirror's state."""

    requests: int
    retention_configs: int
    touches_demote: int
    touches_prefetch: int
    touch_blocks_retagged: int
    touch_blocks_onboarded: int
    touches_skipped_busy: int
    touches_skipped_stale: int
    mirror: MirrorStatistics


class TrtllmEngine:
    """Engine-owned cache: TensorRT-LLM decides, pbkv mirrors and steers (§7.3).

    Args:
        llm: an ``LLM``-shaped object (``generate_async``, ``get_kv_cache_events_async``;
            if it has ``run``, its loop is driven by :meth:`run`).
        kv: the mirror-side KV manager (its policy says whether to steer).
        config: adapter settings.
        hasher: ``(prompt, tokens_per_block, salt) -> block hashes`` as the engine
            computes them; defaults to the fake's (the real engine's is
            :func:`pbkv.engines.trtllm.real.block_key_hasher`).
        api: request classes (default: the real ones for a ``tensorrt_llm`` object).
    """

    owns_cache = False
    has_hidden_state = False

    def __init__(
        self,
        llm: Any,
        kv: MirrorKV,
        config: TrtllmEngineConfig | None = None,
        *,
        hasher: Hasher = prompt_block_hashes,
        api: Api | None = None,
    ) -> None:
        self.llm = llm
        self.kv = kv
        self.config = config or TrtllmEngineConfig()
        if kv.tokens_per_block != self.config.tokens_per_block:
            raise ValueError(
                f"kv.tokens_per_block {kv.tokens_per_block} != the engine's "
                f"{self.config.tokens_per_block}"
            )
        self.hasher = hasher
        self.api = api or load_api(type(llm).__module__.startswith("tensorrt_llm"))
        self.optional = optional_arguments(llm.generate_async)
        self._in_flight = 0
        self._touches_in_flight = 0
        self._kick = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._counts = dict.fromkeys(
            (
                "requests",
                "retention",
                "demote",
                "prefetch",
                "retagged",
                "onboarded",
                "busy",
                "stale",
            ),
            0,
        )
        kv.listener = self._wake

    @property
    def has_host_tier(self) -> bool:
        n = self.kv.mirror.num_blocks_per_level
        return bool(n and n[1])

    def _wake(self) -> None:
        self._kick.set()

    # -- loops --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Drive the engine's loop (if it has one), pump events, issue touches; until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if hasattr(self.llm, "run"):
                await nursery.start(self.llm.run)
            nursery.start_soon(self._pump)
            if self.kv.steering:
                nursery.start_soon(self._touch_loop)
            task_status.started()

    async def _pump(self) -> None:
        """Drain KV events into the mirror (as Dynamo's publisher does, §3.1)."""
        while True:
            got = 0
            async for event in self.llm.get_kv_cache_events_async(
                timeout=self.config.event_timeout_s
            ):
                self.kv.mirror.apply(event)
                got += 1
            if got:
                self.kv.on_stored()
                self._wake()
            await trio.lowlevel.checkpoint()

    async def _touch_loop(self) -> None:
        while True:
            await self._kick.wait()
            self._kick = trio.Event()
            self._issue_touches()

    def _issue_touches(self) -> None:
        """Start touches if the engine has idle capacity (free batch slots)."""
        c = self.config
        slots = min(
            c.max_touches_in_flight - self._touches_in_flight,
            c.max_batch_size - c.max_touches_in_flight - self._in_flight,
        )
        if self.kv.mirror.stale:
            self._counts["stale"] += 1
            return
        if slots <= 0:
            self._counts["busy"] += 1
            return
        touches = self.kv.plan_demotions(slots)
        if len(touches) < slots:
            touches += self.kv.plan_prefetch(slots - len(touches), self._gpu_room_blocks())
        assert self._nursery is not None
        for touch in touches:
            for b in touch.blocks:
                b.pending_touch = True
            self._touches_in_flight += 1
            self._nursery.start_soon(self._run_touch, touch)

    def _gpu_room_blocks(self) -> int:
        """Free GPU blocks plus dead ones (< 30), as far as the mirror knows."""
        levels = self.kv.mirror.num_blocks_per_level
        if levels is None:
            return 0
        mirror = self.kv.mirror
        in_use = self._in_flight * 2  # running requests' private tail blocks, at least
        free = levels[0] - mirror.count(0) - in_use
        return max(0, free) + mirror.dead_gpu_blocks

    async def _run_touch(self, touch: Touch) -> None:
        bs = self.config.tokens_per_block
        config = retention_config(touch.priorities, bs, self.kv.bands.dead, self.api)
        host = sum(b.level == HOST for b in touch.blocks)
        try:
            await self._submit(touch.prompt_token_ids, 1, config, touch.salt, ())
            self._counts[touch.kind] += 1
            self._counts["retagged"] += len(touch.blocks)
            self._counts["onboarded"] += host if touch.kind == "prefetch" else 0
        except Exception as exc:  # a failed touch costs nothing but itself
            log.warning("touch request (%s) failed: %s", touch.kind, exc)
        finally:
            for b in touch.blocks:
                b.pending_touch = False
            self._touches_in_flight -= 1

    # -- requests -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Serve one request through ``generate_async``.

        Raises:
            ValueError: an empty prompt or ``max_new_tokens < 1``.
            EngineError: the engine failed the request.
        """
        if not request.prompt_token_ids or request.max_new_tokens < 1:
            raise ValueError(f"request {request.request_id}: empty prompt or max_new_tokens < 1")
        bs = self.config.tokens_per_block
        prompt = request.prompt_token_ids
        salt = request.namespace
        hashes = self.hasher(prompt, bs, salt)
        mirrored = self.kv.note_request(hashes, request.workflow_id, request.agent, salt)
        host_at_submit = [b.level == HOST for b in mirrored]
        config = self._retention(request, hashes, mirrored) if self.kv.steering else None
        started = trio.current_time()
        out = await self._submit(
            prompt, request.max_new_tokens, config, salt, request.scripted_output_token_ids
        )
        e2e_s = trio.current_time() - started
        completion = out.outputs[0]
        reused = _reused_blocks(completion)
        self.kv.mirror.confirm_prefix(
            hashes, [tuple(prompt[i * bs : (i + 1) * bs]) for i in range(len(hashes))], reused
        )
        self.kv.note_latency(e2e_s)
        self._counts["requests"] += 1
        cached = min(len(prompt) - 1, reused * bs)
        # Upstream reports no GPU/host split: estimate it from the mirror at submit,
        # unless the output carries the fake's ground truth.
        host_blocks = getattr(completion, "onboarded_blocks", None)
        if host_blocks is None:
            host_blocks = sum(host_at_submit[:reused])
        cached_host = min(cached, host_blocks * bs)
        queue_s, ttft_s = _timings(completion, e2e_s)
        return GenerateResult(
            request_id=request.request_id,
            output_token_ids=tuple(completion.token_ids),
            prompt_tokens=len(prompt),
            cached_gpu_tokens=cached - cached_host,
            cached_host_tokens=cached_host,
            computed_tokens=len(prompt) - cached,
            queue_s=queue_s,
            ttft_s=ttft_s,
            e2e_s=e2e_s,
        )

    def _retention(self, request: GenerateRequest, hashes: list[int], mirrored: list) -> object:
        bs = self.config.tokens_per_block
        # The fixed prefix (shared preamble + role prompt) is what every workflow's
        # invocation of this agent shares.
        preamble = request.segment_lengths[0] if request.segment_lengths else 0
        shared = max(preamble, request.fixed_prefix_tokens)
        prios = self.kv.block_priorities(
            hashes,
            mirrored,
            math.ceil(len(request.prompt_token_ids) / bs),
            request.workflow_id,
            request.agent,
            shared,
        )
        decode, decode_s = self.kv.decode_priority(request.workflow_id, request.agent)
        return retention_config(prios, bs, decode, self.api, decode_s)

    async def _submit(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        retention: object | None,
        salt: str,
        scripted: Sequence[int],
    ) -> Any:
        kwargs: dict[str, Any] = {}
        if retention is not None and "kv_cache_retention_config" in self.optional:
            kwargs["kv_cache_retention_config"] = retention
            self._counts["retention"] += 1
        if salt and "cache_salt" in self.optional:
            kwargs["cache_salt"] = salt
        if scripted and "scripted_output_token_ids" in self.optional:
            kwargs["scripted_output_token_ids"] = tuple(scripted)
        params = self.api.SamplingParams(max_tokens=max_tokens, return_perf_metrics=True)
        self._in_flight += 1
        try:
            out = self.llm.generate_async(list(prompt), params, **kwargs)
            return await out.aresult()
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"generate_async failed: {exc}") from exc
        finally:
            self._in_flight -= 1
            self._wake()

    def statistics(self) -> TrtllmStatistics:
        c = self._counts
        return TrtllmStatistics(
            requests=c["requests"],
            retention_configs=c["retention"],
            touches_demote=c["demote"],
            touches_prefetch=c["prefetch"],
            touch_blocks_retagged=c["retagged"],
            touch_blocks_onboarded=c["onboarded"],
            touches_skipped_busy=c["busy"],
            touches_skipped_stale=c["stale"],
            mirror=self.kv.mirror.statistics(),
        )


def _reused_blocks(completion: Any) -> int:
    perf = getattr(completion, "request_perf_metrics", None)
    metrics = getattr(perf, "kv_cache_metrics", None)
    return int(getattr(metrics, "num_reused_blocks", 0) or 0)


def _timings(completion: Any, e2e_s: float) -> tuple[float, float]:
    """``(queue_s, ttft_s)`` from the request's timing metrics, else ``(0, e2e_s)``."""
    timing = getattr(getattr(completion, "request_perf_metrics", None), "timing_metrics", None)
    try:
        arrival = _seconds(timing.arrival_time)
        return (
            _seconds(timing.first_scheduled_time) - arrival,
            _seconds(timing.first_token_time) - arrival,
        )
    except AttributeError:
        return 0.0, e2e_s


def _seconds(value: Any) -> float:
    return value.total_seconds() if hasattr(value, "total_seconds") else float(value)
