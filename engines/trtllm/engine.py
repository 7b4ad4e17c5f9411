"""The TensorRT-LLM adapter: an engine over an ``LLM``-shaped object (§7.3).

``generate`` sends ``generate_async(prompt_token_ids, SamplingParams(max_tokens=...,
return_perf_metrics=True, sampling...), kv_cache_retention_config=..., cache_salt=tenant)``
with the request classes of the engine's own API (the real ``tensorrt_llm`` ones for a
real ``LLM``: it refuses others with ``TypeError``), and fills the result from the
output's ``cached_tokens`` (``tensorrt_llm/executor/result.py``; partially reused
blocks count their matched tokens only) or, where absent, from
``request_perf_metrics.kv_cache_metrics.num_reused_blocks`` (summed over attention
windows upstream). Which optional arguments exist is read from ``generate_async``'s
signature, not assumed.

``run`` pumps KV events into the mirror (:func:`~pbkv.engines.trtllm.events.poll_kv_events`):
it starts after the first request (before it upstream asserts), polls without blocking
every 5 ms while events come and backs off to 20 ms (as Dynamo's publisher,
``components/src/dynamo/trtllm/publisher.py``), and parks once the engine is idle and no
event came for ``event_quiet_s`` until the next request; so it neither spins nor waits
out a busy period. It also issues touch requests (re-tag, prefetch) in idle capacity.
The object may be ``tensorrt_llm.LLM`` (through
:class:`pbkv.engines.trtllm.real.ThreadedLLM`) or the virtual-time
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

from pbkv.engines.base import GREEDY, EngineError, GenerateRequest, GenerateResult, Sampling
from pbkv.engines.trtllm.api import Api, load_api, sampling_arguments
from pbkv.engines.trtllm.blockkey import prompt_block_hashes
from pbkv.engines.trtllm.events import poll_kv_events
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
        partial_reuse: the engine's ``KvCacheConfig.enable_partial_reuse`` (default on
            upstream): where an output lacks ``cached_tokens``, the last reused block
            may be a partial match, so only blocks the mirror confirms count as full.
        event_poll_min_s / event_poll_max_s: the pump's pause after a poll that found
            events / the longest pause it backs off to.
        event_quiet_s: with no request in flight and no event for this long, the pump
            parks until the next request (upstream's default event timeout, 2 s).

    Raises:
        ValueError: a non-positive poll pause, ``min > max``, or a negative quiet period.
    """

    tokens_per_block: int = 32
    max_batch_size: int = 64
    max_touches_in_flight: int = 2
    partial_reuse: bool = True
    event_poll_min_s: float = 0.005
    event_poll_max_s: float = 0.02
    event_quiet_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.event_poll_min_s <= self.event_poll_max_s or self.event_quiet_s < 0:
            raise ValueError(
                f"event_poll_min_s {self.event_poll_min_s} / event_poll_max_s "
                f"{self.event_poll_max_s} / event_quiet_s {self.event_quiet_s}: need "
                "0 < min <= max and quiet >= 0"
            )


@dataclass(frozen=True, slots=True)
class TrtllmStatistics:
    """What the adapter did: requests, retention configs, touches, event polls and
    pump parks, and the mirror's state."""

    requests: int
    retention_configs: int
    touches_demote: int
    touches_prefetch: int
    touch_blocks_retagged: int
    touch_blocks_onboarded: int
    touches_skipped_busy: int
    touches_skipped_stale: int
    mirror: MirrorStatistics
    event_polls: int = 0
    event_parks: int = 0


class TrtllmEngine:
    """Engine-owned cache: TensorRT-LLM decides, pbkv mirrors and steers (§7.3).

    Args:
        llm: an ``LLM``-shaped object (``generate_async``, ``get_kv_cache_events`` and
            ``_executor`` as upstream's; if it has ``run``, its loop is driven by
            :meth:`run`).
        kv: the mirror-side KV manager (its policy says whether to steer).
        config: adapter settings.
        hasher: ``(prompt, tokens_per_block, salt) -> block hashes`` as the engine
            computes them; defaults to the port of upstream's ``BlockKeyHasher``
            (:func:`pbkv.engines.trtllm.blockkey.prompt_block_hashes`).
        api: request classes; default the ``llm``'s ``request_api`` (the real ones for
            :class:`~pbkv.engines.trtllm.real.ThreadedLLM`), else the real ones for a
            ``tensorrt_llm`` object, else pbkv's stand-ins.
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
        self.api = (
            api
            or getattr(llm, "request_api", None)
            or load_api(type(llm).__module__.startswith("tensorrt_llm"))
        )
        self.optional = optional_arguments(llm.generate_async)
        self._in_flight = 0
        self._touches_in_flight = 0
        self._kick = trio.Event()
        self._first_submit = trio.Event()
        self._submitted = trio.Event()  # set by every submit; the parked pump waits on it
        self._parked = trio.Event()  # set while the pump is parked (events are quiet)
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
                "polls",
                "parks",
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
        """Drain KV events into the mirror: after the first request, every 5–20 ms
        while the engine works or events come, parked while it is idle and quiet."""
        c = self.config
        await self._first_submit.wait()
        pause = c.event_poll_min_s
        last_event_s = trio.current_time()
        while True:
            events = poll_kv_events(self.llm)
            self._counts["polls"] += 1
            now = trio.current_time()
            if events:
                self._apply_events(events)
                pause, last_event_s = c.event_poll_min_s, now
            else:
                pause = min(c.event_poll_max_s, 2 * pause)
            if self._in_flight == 0 and now - last_event_s >= c.event_quiet_s:
                await self._park()
                pause, last_event_s = c.event_poll_min_s, trio.current_time()
                continue
            await trio.sleep(pause)

    def _apply_events(self, events: list[dict[str, Any]]) -> None:
        self.kv.mirror.apply_all(events)
        self.kv.on_stored()
        self._wake()

    async def _park(self) -> None:
        """Wait for the next submit; meanwhile the mirror is quiet (see :meth:`events_quiet`)."""
        self._counts["parks"] += 1
        self._submitted = trio.Event()
        self._parked.set()
        await self._submitted.wait()
        self._parked = trio.Event()

    async def events_quiet(self) -> None:
        """Wait until no request is in flight and no KV event came for ``event_quiet_s``
        (the pump has applied everything the engine sent). Does not modify the engine."""
        await self._parked.wait()

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
            await self._submit(touch.prompt_token_ids, 1, config, touch.salt, (), GREEDY)
            # The claim set these priorities (latest claim wins); their ``updated`` events
            # follow within a poll, and re-planning before them would touch again.
            for block, (priority, _) in zip(touch.blocks, touch.priorities, strict=False):
                self.kv.mirror.note_claim(block, priority)
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
        mark = self.kv.mirror.events_applied
        config = self._retention(request, hashes, mirrored) if self.kv.steering else None
        started = trio.current_time()
        out = await self._submit(
            prompt,
            request.max_new_tokens,
            config,
            salt,
            request.scripted_output_token_ids,
            request.sampling,
        )
        e2e_s = trio.current_time() - started
        completion = out.outputs[0]
        cached, full = self._reuse(out, completion, len(prompt), hashes)
        self.kv.mirror.confirm_prefix(
            hashes,
            [tuple(prompt[i * bs : (i + 1) * bs]) for i in range(len(hashes))],
            full,
            mark,
        )
        self.kv.note_latency(e2e_s)
        self._counts["requests"] += 1
        # Upstream reports no GPU/host split: estimate it from the mirror at submit,
        # unless the output carries the fake's ground truth.
        host_blocks = getattr(completion, "onboarded_blocks", None)
        if host_blocks is None:
            host_blocks = sum(host_at_submit[:full])
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

    async def retag(self, prompt_token_ids: Sequence[int], priority: int, salt: str = "") -> Any:
        """Claim every block of a prompt at ``priority`` with a 1-token request (the
        latest claim wins, ``evictionPolicy.cpp::claimBlock``; host blocks are onboarded).

        Returns:
            The engine's finished output.

        Raises:
            ValueError: an empty prompt or a priority outside 0..100.
            EngineError: the engine failed the request.
        """
        if not prompt_token_ids:
            raise ValueError("retag needs a non-empty prompt")
        n_blocks = math.ceil(len(prompt_token_ids) / self.config.tokens_per_block)
        config = retention_config(
            [(priority, None)] * n_blocks, self.config.tokens_per_block, priority, self.api
        )
        return await self._submit(prompt_token_ids, 1, config, salt, (), GREEDY)

    def _reuse(
        self, out: Any, completion: Any, prompt_tokens: int, hashes: list[int]
    ) -> tuple[int, int]:
        """Return ``(cached tokens, full blocks reused)`` of a finished request.

        ``cached_tokens`` (``GenerationResultBase``) counts the matched tokens, partial
        matches included; without it, ``num_reused_blocks`` over the attention windows
        gives blocks, and with partial reuse the last one counts only if the mirror
        holds it as a full block (a partial match's tokens are unknown: not counted).
        """
        bs = self.config.tokens_per_block
        reused = _reused_blocks(completion) // self.kv.mirror.window_count
        tokens = getattr(out, "cached_tokens", None)
        if isinstance(tokens, int) and (tokens > 0 or reused == 0):
            cached = min(prompt_tokens - 1, tokens)
            return cached, min(cached // bs, len(hashes))
        full = min(reused, len(hashes))
        if (
            self.config.partial_reuse
            and 0 < full == reused
            and hashes[full - 1] not in self.kv.mirror.blocks
        ):
            full -= 1  # it may have been a partial match
        return min(prompt_tokens - 1, full * bs), full

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
        sampling: Sampling,
    ) -> Any:
        kwargs: dict[str, Any] = {}
        if retention is not None and "kv_cache_retention_config" in self.optional:
            kwargs["kv_cache_retention_config"] = retention
            self._counts["retention"] += 1
        if salt and "cache_salt" in self.optional:
            kwargs["cache_salt"] = salt
        if scripted and "scripted_output_token_ids" in self.optional:
            kwargs["scripted_output_token_ids"] = tuple(scripted)
        self._in_flight += 1
        try:
            params = self.api.SamplingParams(
                max_tokens=max_tokens, return_perf_metrics=True, **sampling_arguments(sampling)
            )
            out = self.llm.generate_async(list(prompt), params, **kwargs)
            self._first_submit.set()  # the engine's event queue exists from now on
            self._submitted.set()
            return await out.aresult()
        except (ValueError, RuntimeError, TypeError) as exc:
            raise EngineError(f"generate_async failed: {type(exc).__name__}: {exc}") from exc
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
            event_polls=c["polls"],
            event_parks=c["parks"],
        )


def _reused_blocks(completion: Any) -> int:
    perf = getattr(completion, "request_perf_metrics", None)
    metrics = getattr(perf, "kv_cache_metrics", None)
    return int(getattr(metrics, "num_reused_blocks", 0) or 0)


def _timings(completion: Any, e2e_s: float) -> tuple[float, float]:
    """``(queue_s, ttft_s)`` from the request's timing metrics, else ``(0, e2e_s)``.

    The binding's time points are steady-clock durations (``timedelta``) or floats; any
    other shape falls back rather than failing the request.
    """
    timing = getattr(getattr(completion, "request_perf_metrics", None), "timing_metrics", None)
    try:
        arrival = _seconds(timing.arrival_time)
        return (
            _seconds(timing.first_scheduled_time) - arrival,
            _seconds(timing.first_token_time) - arrival,
        )
    except (AttributeError, TypeError, ValueError):
        return 0.0, e2e_s


def _seconds(value: Any) -> float:
    return value.total_seconds() if hasattr(value, "total_seconds") else float(value)
