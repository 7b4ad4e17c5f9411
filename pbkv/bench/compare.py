"""Compare cache policies on the same generated workload in one run (§9).

Each policy serves an identical copy of the workload through the full actor system on
the virtual-time engine, under ``MockClock(autojump_threshold=0)`` with trio's
scheduler seeded, so the same seed gives the same figures.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import trio
import trio.testing

from pbkv.actors.events import RAN_TO_END
from pbkv.actors.workflow import WorkflowOutcome
from pbkv.actors.workload import Workflow
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.floor import latency_floor
from pbkv.engines.sim.profile import list_profiles, load_hardware, load_model
from pbkv.kvmanager import (
    AccessLog,
    BaselineInputs,
    FutureStep,
    KVStatistics,
    block_keys,
    ceiling_hits,
    get_policy,
    min_hits,
)
from pbkv.live.build import (
    DEFAULT_HOST_TIER,
    NO_PREDICTOR,
    ONLINE_PREDICTOR,
    RuntimeConfig,
    build_engine,
    default_scheduler,
    open_runtime,
)
from pbkv.live.chat import raw_format
from pbkv.live.driver import serve_replays
from pbkv.predictor import CallGraph, NoiseForecaster, OnlineMarkovForecaster, make_forecaster
from pbkv.predictor.base import Forecaster
from pbkv.predictor.dataset import task_group
from pbkv.predictor.noise import OnlineNoiseForecaster

log = logging.getLogger(__name__)


DEFAULT_POLICIES = ("lru", "lru:fcfs-balanced", "lru:workflow", "pbkv")
"""The rows that split pbkv's gain over ``lru`` into batching, admission and the cache
policy (each row adds one part; see :func:`pbkv.bench.report.gain_decomposition`)."""


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


END_REASONS = ("end", "recursion_limit", "error", "aborted")
"""How a workflow may end (``WorkflowTerminated.reason``), in the table's order."""


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """Summary of one policy's run (times in simulated seconds).

    Latencies are over the workflows that ran to their end (``end`` or
    ``recursion_limit``); ``end_reasons`` counts every workflow by how it ended.
    ``recomputed_tokens`` counts every prompt token prefilled, a retracted request's
    second prefill included; the hit rates count each request once, at its first
    admission. ``retractions``: running requests the scheduler paused to admit another
    (§7.0). ``wall_s`` and ``cpu_s`` are the real seconds the run took, on the wall
    clock and as this process's CPU time (``time.process_time``: steadier than the wall
    clock on a shared machine; ``nan`` where not measured). ``goodput_workflows_per_s``:
    workflows that ran to their end within ``BenchConfig.slo_s``, per second of makespan
    (``nan`` without an SLO).
    """

    policy: str
    predictor: str
    workflows: int
    failed_workflows: int
    mean_latency_s: float
    p50_latency_s: float
    p99_latency_s: float
    mean_ttft_s: float
    gpu_hit_rate: float
    host_hit_rate: float
    total_hit_rate: float
    recomputed_tokens: int
    throughput_workflows_per_s: float
    makespan_s: float
    kv: KVStatistics
    wall_s: float
    hit_timeline: tuple[tuple[float, float], ...] = field(default=(), repr=False)
    end_reasons: dict[str, int] = field(default_factory=dict)
    scheduler: str = "fcfs"
    ceiling_hit_rate: float = float("nan")
    min_gpu_hit_rate: float = float("nan")
    min_total_hit_rate: float = float("nan")
    retractions: int = 0
    cpu_s: float = float("nan")
    max_latency_s: float = float("nan")
    goodput_workflows_per_s: float = float("nan")


@dataclass(frozen=True, slots=True)
class Bounds:
    """What no policy can do better than on one bench's workload.

    Attributes:
        ceiling_hit_rate: infinite-cache hit rate over any order of the workload's
            requests (:func:`~pbkv.kvmanager.ceiling_hits`); no policy's total hit rate,
            under any scheduler, exceeds it.
        floor_latency_s: a lower bound on mean workflow latency (over the workflows
            the rows average over) that no policy, scheduler or tier size on the sim
            engine beats
            (:func:`~pbkv.engines.sim.floor.latency_floor`): the larger of each
            workflow's critical path alone with every shareable block cached, and the
            closed-loop bound from the GPU's compute rate and bandwidth.
        uncontested_latency_s: a reference, not a bound: mean workflow latency of
            ``FLOOR_SPEC`` (arrival order, balanced batches) with a GPU tier that holds
            everything, i.e. what the cache alone can give. A scheduler that holds
            workflows back can go below it (financebench c=32: pbkv:workflow 263.92 s
            against 304.33 s).
        min_hit_rate / min_total_hit_rate: exact offline MIN at the GPU capacity, and
            at GPU + host capacity, over the recorded access order of ``min_order``'s
            run; no demand policy (no prefetch) beats them on that order.
        min_order: the ``policy:scheduler`` row whose access order MIN replays.
    """

    ceiling_hit_rate: float
    floor_latency_s: float
    min_hit_rate: float
    min_total_hit_rate: float
    min_order: str
    uncontested_latency_s: float


@dataclass(frozen=True, slots=True)
class BenchRun:
    """One bench: the rows, the GPU tier used and the bounds.

    Attributes:
        results: one row per policy spec, in order.
        gpu_kv_tokens: the GPU tier every row ran with.
        wanted_gpu_kv_tokens: what was asked for (or the default sizing) before the
            profile's KV capacity capped it; equal to ``gpu_kv_tokens`` when uncapped.
        profile_kv_tokens: the hardware x model profile's GPU KV capacity.
        bounds: the bounds, or ``None`` when not computed.
        rate: the open-loop arrival rate the rows ran at (workflows per second;
            ``--load``'s is measured), or ``None`` for a closed loop or a trace's times.
    """

    results: list[PolicyResult]
    gpu_kv_tokens: int
    wanted_gpu_kv_tokens: int
    profile_kv_tokens: int
    bounds: Bounds | None
    rate: float | None = None

    @property
    def gpu_kv_capped(self) -> bool:
        return self.wanted_gpu_kv_tokens > self.gpu_kv_tokens


def gpu_tokens_for(workload: Sequence[Workflow], concurrency: int) -> int:
    """Return half the KV tokens ``concurrency`` workflows would keep for reuse.

    A workflow's reusable set is, per agent, its longest prompt + output; the shared
    preamble is counted once. The median workflow stands for one slot. Never less than
    the largest single request plus a little room (64 tokens), so every request fits.
    """
    per_workflow = []
    for wf in workload:
        longest: dict[str, int] = {}
        for s in wf.steps:
            longest[s.agent] = max(longest.get(s.agent, 0), s.prompt_tokens + s.output_tokens)
        preamble = len(wf.steps[0].segments[0].token_ids) if wf.steps else 0
        per_workflow.append(sum(longest.values()) - preamble * (len(longest) - 1))
    slots = min(concurrency, len(per_workflow))
    largest = max((s.prompt_tokens + s.output_tokens for w in workload for s in w.steps), default=0)
    return max(int(0.5 * slots * float(np.median(per_workflow))), largest + 64)


def runtime_config(
    config: BenchConfig, policy: str, scheduler: str, gpu_kv_tokens: int
) -> RuntimeConfig:
    """Return the :class:`~pbkv.live.build.RuntimeConfig` of one bench row: the runtime
    ``open_runtime(engine="sim", policy=...)`` builds, with the row's tiers and profiles."""
    host_tokens = config.host_kv_tokens if config.host_kv_tokens is not None else 2 * gpu_kv_tokens
    return RuntimeConfig(
        engine="sim",
        model=config.model,
        hardware=config.hardware,
        policy=policy,
        scheduler=scheduler,
        gpu_kv_tokens=gpu_kv_tokens,
        host_kv_tokens=host_tokens,
        block_size=config.block_size,
        max_queued_requests=REPLAY_QUEUE,
        check_integrity=config.check_integrity,
        horizon=config.horizon,
        gamma=config.gamma,
        seed=config.seed,
        predictor=ONLINE_PREDICTOR if config.predictor == ONLINE_PREDICTOR else NO_PREDICTOR,
        host_tier=config.host_tier,
    )


REPLAY_QUEUE = 1 << 30
"""Calls a replay may queue: the bench's concurrency is its only admission limit."""


def row_forecasters(
    config: BenchConfig,
    policy: str,
    fitted: Sequence[Forecaster],
    app: str,
    app_agents: Sequence[str],
    app_edges: Sequence[tuple[str, str]],
) -> list[Forecaster]:
    """Return one row's forecaster chain: ``fitted`` (a model fitted before the run), or
    for ``online`` a fresh online forecaster warm-started from the app's declared edges,
    as :func:`pbkv.live.serve_app` starts it (each row learns from its own run only)."""
    if not get_policy(policy).uses_forecasts:
        return []
    if config.predictor != ONLINE_PREDICTOR:
        return list(fitted)
    online = OnlineMarkovForecaster(horizon=config.horizon)
    if app_agents:
        online.warm_start(app, app_agents, app_edges)
    if config.noise > 0:
        return [OnlineNoiseForecaster(online, config.noise, seed=config.seed)]
    return [online]


def run_policy(
    workload: Sequence[Workflow],
    config: BenchConfig,
    policy: str,
    forecasters: Sequence[Forecaster],
    *,
    gpu_kv_tokens: int,
    step_graph_edges: tuple[tuple[str, str], ...] = (),
    app_agents: tuple[str, ...] = (),
    on_outcome: Callable[[WorkflowOutcome], None] | None = None,
    scheduler: str | None = None,
    access_log: AccessLog | None = None,
) -> PolicyResult:
    """Serve ``workload`` under ``policy`` in virtual time and summarise it.

    The row runs the runtime an app embeds: :func:`~pbkv.live.build.open_runtime` over
    :func:`~pbkv.live.build.build_engine` with the row's :func:`runtime_config`, the
    workflows replayed through it (:func:`~pbkv.live.driver.serve_replays`).
    ``policy`` may name its scheduler (``lru:workflow``); otherwise ``scheduler``, then
    ``config.scheduler``, then the policy's default (:func:`resolve_spec`).
    ``forecasters`` is a fitted chain (``config.predictor`` other than ``online``);
    ``step_graph_edges`` / ``app_agents`` are the app's call graph (``kvflow`` and the
    online forecaster's warm start); ``belady-est`` reads the workload's future block
    keys directly. With ``access_log`` the row also carries MIN over its own access order
    and the ceiling.
    """
    policy, scheduler = resolve_spec(policy, scheduler or config.scheduler)
    bs = config.block_size
    row = runtime_config(config, policy, scheduler, gpu_kv_tokens)
    gpu_blocks = gpu_kv_tokens // bs
    host_blocks = (row.host_kv_tokens or 0) // bs
    baseline = baseline_inputs(workload, config, policy, step_graph_edges)
    app = workload[0].app if workload else config.app
    chain = row_forecasters(config, policy, forecasters, app, app_agents, step_graph_edges)
    timeline: list[tuple[float, float]] = []
    kv_stats: KVStatistics | None = None
    retractions = 0

    arrivals: dict[str, float] = {}

    async def main() -> list[WorkflowOutcome]:
        built = build_engine(row, baseline=baseline, access_log=access_log)
        built = dataclasses.replace(built, chat=raw_format(), model_name="replay")
        async with open_runtime(row, forecasters=chain, built=built) as runtime:
            if config.open_loop:
                t0 = trio.current_time()
                arrivals.update({w.workflow_id: t0 + max(0.0, w.arrival_s) for w in workload})
            outcomes = await serve_replays(
                runtime,
                workload,
                concurrency=config.concurrency,
                open_loop=config.open_loop,
                on_outcome=on_outcome,
            )
        nonlocal kv_stats, retractions
        kv_stats = built.kv.statistics()
        retractions = built.engine.statistics().retractions
        return outcomes

    started, started_cpu = time.perf_counter(), time.process_time()
    outcomes = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - started_cpu
    assert kv_stats is not None
    by_id = {w.workflow_id: w for w in workload}
    for o in outcomes:
        t = o.start_s
        for step, r in zip(by_id[o.workflow_id].steps, o.results, strict=False):
            t += step.gap_s + r.e2e_s  # invocations of a workflow run back to back
            timeline.append((t, r.cached_gpu_tokens / max(1, r.prompt_tokens)))
    timeline.sort()
    result = summarise_outcomes(
        policy,
        config,
        outcomes,
        kv_stats,
        wall_s,
        timeline,
        scheduler=scheduler,
        arrivals_s=arrivals or None,
    )
    result = dataclasses.replace(result, retractions=retractions, cpu_s=cpu_s)
    if access_log is None:
        return result
    return dataclasses.replace(
        result,
        ceiling_hit_rate=access_log.hit_rate(ceiling_hits(access_log)),
        min_gpu_hit_rate=access_log.hit_rate(min_hits(access_log, gpu_blocks)),
        min_total_hit_rate=access_log.hit_rate(min_hits(access_log, gpu_blocks + host_blocks)),
    )


FLOOR_SPEC = "lru:fcfs-balanced"
"""The uncontested run's ``policy:scheduler``: arrival order and balanced (stall-free)
batches, under a GPU tier that holds everything (``Bounds.uncontested_latency_s``)."""


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


def row_name(result: PolicyResult) -> str:
    """Return ``policy:scheduler`` for a row (how tables and bounds name it)."""
    return f"{result.policy}:{result.scheduler}"


def baseline_inputs(
    workload: Sequence[Workflow],
    config: BenchConfig,
    policy: str,
    step_graph_edges: tuple[tuple[str, str], ...],
) -> BaselineInputs:
    """Return what ``policy`` needs beyond the cache: the app's step graph (kvflow) and,
    for belady, every workflow's future prompts with modelled start offsets."""
    future = None
    if get_policy(policy).tracker == "belady":
        cost = CostModel(load_hardware(config.hardware), load_model(config.model))
        future = {w.workflow_id: _future_steps(w, cost, config) for w in workload}
    return BaselineInputs(tuple(step_graph_edges), future, config.concurrency)


def _future_steps(wf: Workflow, cost: CostModel, config: BenchConfig) -> list[FutureStep]:
    """Each step's prompt keys and estimated start offset (gaps + modelled step times).

    A step is estimated as its prefill alone plus its decode at the configured
    concurrency; only the *order* of next uses matters to Belady.
    """
    decode_s = cost.decode_step_s(config.concurrency, config.concurrency * 4096)
    steps, offset = [], 0.0
    for s in wf.steps:
        offset += s.gap_s
        steps.append(
            FutureStep(block_keys(s.prompt_token_ids, config.block_size, wf.tenant), offset)
        )
        offset += cost.prefill_s(s.prompt_tokens) + s.output_tokens * decode_s
    return steps


def summarise_outcomes(
    policy: str,
    config: BenchConfig,
    outcomes: list[WorkflowOutcome],
    kv: KVStatistics,
    wall_s: float,
    timeline: list[tuple[float, float]],
    *,
    scheduler: str = "fcfs",
    arrivals_s: Mapping[str, float] | None = None,
) -> PolicyResult:
    """Summarise one policy's run: latency percentiles over the workflows that ran to
    their end (``end`` or ``recursion_limit``; not ``error``/``aborted``), counts by end
    reason, mean TTFT over invocations, hit rates from the KV statistics, throughput
    over the makespan.

    Times are in whatever clock the run used (simulated or wall seconds). With
    ``arrivals_s`` (open loop: workflow id -> arrival time on the run's clock) a
    workflow's latency counts from its arrival, the wait for an open slot included;
    otherwise from when it started (closed loop: when its slot opened).
    """
    start = {o.workflow_id: o.start_s for o in outcomes}
    if arrivals_s is not None:
        start.update({w: t for w, t in arrivals_s.items() if w in start})
    ran = [o.end_s - start[o.workflow_id] for o in outcomes if o.reason in RAN_TO_END]
    latencies = np.array(ran or [np.nan])
    reasons = Counter(o.reason for o in outcomes)
    ttfts = np.array([r.ttft_s for o in outcomes for r in o.results])
    makespan = max(o.end_s for o in outcomes) - min(start.values())
    good = math.nan  # one object: records of equal runs compare equal
    if config.slo_s is not None and makespan > 0:
        good = sum(1 for latency in ran if latency <= config.slo_s) / makespan
    return PolicyResult(
        policy=policy,
        predictor=config.predictor if get_policy(policy).uses_forecasts else "-",
        workflows=len(outcomes),
        failed_workflows=sum(o.reason == "error" for o in outcomes),
        mean_latency_s=float(latencies.mean()),
        p50_latency_s=float(np.percentile(latencies, 50)),
        p99_latency_s=float(np.percentile(latencies, 99)),
        mean_ttft_s=float(ttfts.mean()) if len(ttfts) else 0.0,
        gpu_hit_rate=kv.gpu_hit_rate,
        host_hit_rate=kv.host_hit_rate,
        total_hit_rate=kv.total_hit_rate,
        recomputed_tokens=kv.computed_tokens + kv.resumed_computed_tokens,
        throughput_workflows_per_s=len(outcomes) / makespan if makespan > 0 else 0.0,
        makespan_s=makespan,
        kv=kv,
        wall_s=wall_s,
        hit_timeline=tuple(timeline),
        end_reasons={reason: reasons[reason] for reason in END_REASONS},
        scheduler=scheduler,
        max_latency_s=float(latencies.max()),
        goodput_workflows_per_s=good,
    )


def check_prompts(workload: Sequence[Workflow], app: str) -> None:
    """Raise ``ValueError`` naming the first step of ``app``'s workload whose prompt is empty
    (no engine serves one; a user's app can generate one)."""
    for w in workload:
        for i, s in enumerate(w.steps):
            if not s.prompt_tokens:
                raise ValueError(
                    f"app {app!r}: workflow {w.workflow_id!r} step {i} (agent {s.agent!r}) "
                    "has an empty prompt"
                )


def _check_fits(
    workload: Sequence[Workflow], gpu_kv_tokens: int, config: BenchConfig, cost: CostModel
) -> None:
    """Raise ``ValueError`` when the GPU tier cannot hold the workload's largest request,
    saying whether ``--gpu-kv-tokens`` or the profile's KV capacity is the limit."""
    largest = max((s.prompt_tokens + s.output_tokens for w in workload for s in w.steps), default=0)
    if -(-largest // config.block_size) * config.block_size <= gpu_kv_tokens:
        return
    capacity = cost.gpu_kv_capacity_tokens
    shipped = list_profiles()
    fix = (
        f"the tier is capped at {config.hardware} x {config.model}'s KV capacity "
        f"({capacity:,} tokens): pick a profile with more (--hardware, --model; "
        f"shipped: {', '.join((*shipped.hardware, *shipped.model))})"
        if gpu_kv_tokens >= capacity
        else "raise --gpu-kv-tokens"
    )
    raise ValueError(
        f"GPU KV capacity of {gpu_kv_tokens:,} tokens cannot hold the workload's largest "
        f"request ({largest:,} prompt + output tokens); {fix}"
    )


def build_forecasters(
    config: BenchConfig,
    app_agents: Sequence[str],
    app_edges: Sequence[tuple[str, str]],
    workload: Sequence[Workflow],
    train: Sequence[Workflow],
) -> list[Forecaster]:
    """Return the predictor chain for ``config.predictor``, fitted on ``train``.

    Training workflows whose task appears in the workload are left out (τ-bench replays
    the same 200 episodes under every seed). A learned model falls back to markov-1.
    """
    agents = tuple(app_agents)
    seen = {task_group(w.to_trace()) for w in workload}
    traces = [t for t in (w.to_trace() for w in train) if task_group(t) not in seen]
    paths = {w.workflow_id: w.agents for w in workload}
    graph, added = CallGraph(agents, app_edges).widened(traces)
    if added:  # a fan-out app: its runs step between concurrent branches
        log.info("predictor call graph: %d transitions of the app's runs added to its edges", added)

    def build(name: str) -> Forecaster:
        return make_forecaster(
            name,
            agents=agents,
            horizon=config.horizon,
            traces=traces,
            workflows=paths,
            graph=graph,
            checkpoint=config.checkpoint,
        )

    chain = [build(config.predictor)]
    if config.predictor == "graphsage":
        chain.append(build("markov-1"))
    if config.noise > 0:
        chain = [NoiseForecaster(f, config.noise, seed=config.seed) for f in chain]
    return chain


def compare_policies(
    config: BenchConfig,
    *,
    on_outcome: Callable[[str, WorkflowOutcome], None] | None = None,
) -> tuple[list[PolicyResult], int]:
    """Run every policy of ``config`` on one workload, without bounds.

    Returns:
        The per-policy results (in ``config.policies`` order) and the GPU KV capacity in
        tokens that was used.

    Raises:
        ValueError: unknown app, policy, scheduler, predictor or profile name.
    """
    run = run_bench(config, on_outcome=on_outcome, bounds=False)
    return run.results, run.gpu_kv_tokens


def run_bench(
    config: BenchConfig,
    *,
    on_outcome: Callable[[str, WorkflowOutcome], None] | None = None,
    bounds: bool = True,
) -> BenchRun:
    """Run every policy spec of ``config`` on one workload, and the bounds beside them.

    ``on_outcome(spec, outcome)`` is called as each workflow ends (progress bars); the
    uncontested reference run reports as ``"uncontested"``.

    Raises:
        ValueError: unknown app, policy, scheduler, predictor or profile name.
    """
    from pbkv.examples import get_app  # a registered name or a user's "module:attribute"

    for spec in config.policies:
        resolve_spec(spec, config.scheduler)
    app = get_app(config.app)
    if getattr(app, "open_loop", False):  # a trace with arrival times (mooncake)
        config = dataclasses.replace(config, open_loop=True)
    workload = app.generate(config.workflows, config.seed)
    check_prompts(workload, config.app)
    if config.gap_scale != 1.0:
        workload = scale_gaps(workload, config.gap_scale)
    if config.rate is not None or config.load is not None:
        config, workload = open_loop_at(config, workload, app)
    if config.open_loop and all(w.arrival_s <= 0 for w in workload):
        log.warning(
            "open loop: app %r gives every workflow arrival time 0, so each starts as soon "
            "as a slot frees, as in closed loop",
            config.app,
        )
    forecasters: list[Forecaster] = []
    if config.predictor != ONLINE_PREDICTOR and any(
        get_policy(resolve_spec(spec, config.scheduler)[0]).uses_forecasts
        for spec in config.policies
    ):
        train = app.generate(config.train_workflows, config.seed + 10_000)
        forecasters = build_forecasters(config, app.agents, app.edges, workload, train)
    wanted = config.gpu_kv_tokens or gpu_tokens_for(workload, config.concurrency)
    cost = CostModel(load_hardware(config.hardware), load_model(config.model))
    gpu_tokens = min(wanted, cost.gpu_kv_capacity_tokens)
    _check_fits(workload, gpu_tokens, config, cost)
    results = []
    for spec in config.policies:
        callback = None if on_outcome is None else (lambda o, p=spec: on_outcome(p, o))
        results.append(
            run_policy(
                workload,
                config,
                spec,
                forecasters,
                gpu_kv_tokens=gpu_tokens,
                step_graph_edges=tuple(app.edges),
                app_agents=tuple(app.agents),
                on_outcome=callback,
                access_log=AccessLog(config.block_size) if bounds else None,
            )
        )
    found = None
    if bounds:
        reference = None if on_outcome is None else (lambda o: on_outcome("uncontested", o))
        found = _bounds(workload, config, results, reference)
    return BenchRun(
        results, gpu_tokens, wanted, cost.gpu_kv_capacity_tokens, found, rate=config.rate
    )


def scale_gaps(workload: Sequence[Workflow], factor: float) -> list[Workflow]:
    """Return ``workload`` with every step's tool/think gap multiplied by ``factor`` (what
    ``open_runtime(gap_scale=factor)`` does to the same app's simulated tools and replies).

    Raises:
        ValueError: ``factor`` negative or not finite.
    """
    if not (math.isfinite(factor) and factor >= 0):
        raise ValueError(f"gap_scale must be finite and >= 0, got {factor}")
    return [
        dataclasses.replace(
            w, steps=tuple(dataclasses.replace(s, gap_s=s.gap_s * factor) for s in w.steps)
        )
        for w in workload
    ]


CAPACITY_SPEC = "lru:workflow"
"""The strongest baseline, whose closed-loop throughput ``--load`` is a fraction of."""


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Return ``n`` arrival times (seconds from 0) of a Poisson process at ``rate`` per
    second: exponential gaps of mean ``1 / rate``, seeded by ``seed``.

    Raises:
        ValueError: ``rate <= 0``.
    """
    if not rate > 0:
        raise ValueError(f"rate must be > 0 workflows per second, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return [float(t) for t in np.cumsum(gaps) - gaps[0]]  # the first arrives at 0


def open_loop_at(
    config: BenchConfig, workload: Sequence[Workflow], app: object
) -> tuple[BenchConfig, list[Workflow]]:
    """Return ``config`` and ``workload`` for an open-loop run at ``config.rate`` (or at
    ``config.load`` × the strongest baseline's measured capacity): Poisson arrivals.

    Raises:
        ValueError: both or a non-positive ``rate`` / ``load``.
    """
    if config.rate is not None and config.load is not None:
        raise ValueError("give --rate or --load, not both")
    rate = config.rate
    if config.load is not None:
        if not config.load > 0:
            raise ValueError(f"load must be > 0, got {config.load}")
        rate = config.load * baseline_capacity(config, workload, app)
    assert rate is not None
    times = poisson_arrivals(len(workload), rate, config.seed)
    timed = [dataclasses.replace(w, arrival_s=t) for w, t in zip(workload, times, strict=True)]
    return dataclasses.replace(config, open_loop=True, rate=rate), timed


def baseline_capacity(config: BenchConfig, workload: Sequence[Workflow], app: object) -> float:
    """Return the strongest baseline's capacity: :data:`CAPACITY_SPEC`'s throughput in
    workflows per second, closed loop at ``config.concurrency`` on ``workload``."""
    closed = dataclasses.replace(config, open_loop=False, rate=None, load=None)
    wanted = config.gpu_kv_tokens or gpu_tokens_for(workload, config.concurrency)
    cost = CostModel(load_hardware(config.hardware), load_model(config.model))
    result = run_policy(
        workload,
        closed,
        CAPACITY_SPEC,
        (),
        gpu_kv_tokens=min(wanted, cost.gpu_kv_capacity_tokens),
        step_graph_edges=tuple(getattr(app, "edges", ())),
    )
    return result.throughput_workflows_per_s


def baseline_result(results: Sequence[PolicyResult]) -> PolicyResult:
    """Return the row ratios are taken against: the first ``lru`` row, else the first."""
    return next((r for r in results if r.policy == "lru"), results[0])


def _bounds(
    workload: Sequence[Workflow],
    config: BenchConfig,
    results: Sequence[PolicyResult],
    on_outcome: Callable[[WorkflowOutcome], None] | None,
) -> Bounds:
    """Return the bounds: the rows' ceiling and MIN (of the lru row, else the first), the
    latency floor, and the latency of an uncontested run (a GPU tier that holds every
    token served) for reference."""
    base = baseline_result(results)
    bs = config.block_size
    everything = sum(s.prompt_tokens + s.output_tokens + bs for w in workload for s in w.steps)
    uncontested = dataclasses.replace(config, host_kv_tokens=0)
    reference = run_policy(
        workload,
        uncontested,
        FLOOR_SPEC,
        (),
        gpu_kv_tokens=everything,
        on_outcome=on_outcome,
    )
    cost = CostModel(load_hardware(config.hardware), load_model(config.model))
    bound = latency_floor(
        workload,
        cost,
        block_size=bs,
        concurrency=config.concurrency,
        open_loop=config.open_loop,
        measured_reasons=RAN_TO_END,  # the workflows summarise_outcomes averages over
    )
    return Bounds(
        ceiling_hit_rate=max(r.ceiling_hit_rate for r in results),
        floor_latency_s=bound.mean_latency_s,
        min_hit_rate=base.min_gpu_hit_rate,
        min_total_hit_rate=base.min_total_hit_rate,
        min_order=row_name(base),
        uncontested_latency_s=reference.mean_latency_s,
    )
