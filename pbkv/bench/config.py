"""What one bench compares: :class:`BenchConfig` (workload, policy specs, tiers, engine
profiles, predictor, loop) and the ``name:scheduler`` policy specs it lists."""

from __future__ import annotations

from dataclasses import dataclass

from pbkv.live.build import DEFAULT_HOST_TIER, ONLINE_PREDICTOR, default_scheduler

DEFAULT_POLICIES = ("lru", "lru:fcfs-balanced", "lru:workflow", "pbkv")
"""The rows that split pbkv's gain over ``lru`` into batching, admission and the cache
policy (each row adds one part; see :func:`pbkv.bench.gains.gain_decomposition`)."""


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One comparison: a workload, the policies, the engine and the predictor.

    Args:
        app: app registry name.
        policies: policy specs (``name`` or ``name:scheduler``), compared on the same
            workload.
        workflows: workflows in the workload.
        concurrency: workflows in flight at once.
        gpu_kv_tokens: GPU KV capacity in tokens; ``None`` = half the workload's
            concurrent working set (so the tier is under pressure), capped by the profile.
        host_kv_tokens: host tier capacity in tokens; ``None`` = 2 × the GPU tier
            (SGLang HiCache's default host-to-device ratio, ``hicache_ratio=2``).
        host_tier: ``write-through`` (SGLang HiCache's default: the host keeps a copy
            of what is on the GPU, so it adds about ``host - GPU`` distinct tokens) or
            ``exclusive`` (TensorRT-LLM: offload on GPU eviction).
        seed: workload and scheduler seed.
        predictor: forecaster name for score-based policies: ``online`` (what
            ``open_runtime`` and ``pbkv serve`` run: learns as the row runs, warm-started
            from the app's edges), or a model fitted before the run (``markov``,
            ``graphsage``, ``oracle``, …).
        train_workflows: workflows (from another seed) a fitted predictor is fitted on.
        hardware / model: sim profiles.
        block_size: tokens per KV block.
        horizon / gamma: score horizon K and decay.
        noise: ``lambda`` of the noise wrapper ``(1-lambda) P + lambda U`` on the
            predictor (``U`` a random distribution per forecast row, seeded by ``seed``).
        checkpoint: GraphSAGE checkpoint folder for ``predictor="graphsage"`` (read only
            when a policy uses forecasts).
        check_integrity: assert the KV manager's invariants after every engine step
            (slow; for debugging a policy).
        scheduler: admission scheduler for every policy spec that names none (``None``:
            each policy's default, :data:`DEFAULT_SCHEDULERS`).
        open_loop: start each workflow no earlier than its ``Workflow.arrival_s``
            (``concurrency`` still caps those open, as a server's session limit);
            ``False``: closed loop, the next workflow starts when a slot frees. An app
            whose ``open_loop`` attribute is true (``mooncake``, a trace with arrival
            times) always runs open loop. Latency counts from arrival (open loop) or
            from when the workflow's slot opens (closed loop), §9.
        rate: open loop with Poisson session arrivals at this many workflows per
            (simulated) second, seeded by ``seed`` (replaces the workload's own times).
        load: open loop at this fraction of the strongest baseline's capacity
            (``lru:workflow``'s closed-loop throughput at ``concurrency``, measured on the
            same workload first); exclusive with ``rate``.
        slo_s: a workflow latency target: each row reports its goodput (workflows per
            second finishing within it).
        gap_scale: factor on every tool and think gap of the workload (real agents wait
            seconds to minutes on tools and users; the runtime scales the same way).
        gap_model: the gaps a bundled app draws: ``bundled`` (its own) or ``cited``
            (documented tool latencies and think times, :mod:`pbkv.examples.gaps`).
    """

    app: str = "codegen"
    policies: tuple[str, ...] = DEFAULT_POLICIES
    workflows: int = 64
    concurrency: int = 16
    gpu_kv_tokens: int | None = None
    host_kv_tokens: int | None = None
    seed: int = 0
    predictor: str = ONLINE_PREDICTOR
    train_workflows: int = 300
    hardware: str = "a6000-tp2"
    model: str = "qwen3-32b"
    block_size: int = 16
    horizon: int = 3
    gamma: float = 0.8
    noise: float = 0.0
    checkpoint: str | None = None
    check_integrity: bool = False
    scheduler: str | None = None
    open_loop: bool = False
    host_tier: str = DEFAULT_HOST_TIER
    rate: float | None = None
    load: float | None = None
    slo_s: float | None = None
    gap_scale: float = 1.0
    gap_model: str = "bundled"


def resolve_spec(spec: str, scheduler: str | None = None) -> tuple[str, str]:
    """Split a policy spec ``name`` or ``name:scheduler`` into (policy, scheduler).

    A scheduler in the spec wins over ``scheduler``; without either the policy's default
    (:data:`DEFAULT_SCHEDULERS`, else ``fcfs``) applies.

    Raises:
        ValueError: unknown policy or scheduler name (the message lists the known ones).
    """
    from pbkv.engines.scheduler import get_scheduler

    name, _, named = spec.partition(":")
    chosen = named or scheduler or default_scheduler(name)
    get_scheduler(chosen)
    return name, chosen
