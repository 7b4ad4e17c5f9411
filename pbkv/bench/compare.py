"""Compare cache policies on the same generated workload in one run (§9).

Each policy serves an identical copy of the workload through the full actor system on
the virtual-time engine, under ``MockClock(autojump_threshold=0)`` with trio's
scheduler seeded, so the same seed gives the same figures.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import trio
import trio.testing

from pbkv.actors.serve import serve_workflows
from pbkv.actors.workflow import WorkflowOutcome
from pbkv.actors.workload import Workflow
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.engine import SimConfig, SimEngine
from pbkv.engines.sim.profile import load_hardware, load_model
from pbkv.kvmanager import (
    BaselineInputs,
    FutureStep,
    KVConfig,
    KVManager,
    KVStatistics,
    block_keys,
    get_policy,
)
from pbkv.predictor import CallGraph, NoiseForecaster, make_forecaster
from pbkv.predictor.base import Forecaster
from pbkv.predictor.dataset import task_group
from pbkv.runtime import seed_scheduler


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One comparison: a workload, the policies, the engine and the predictor.

    Args:
        app: app registry name.
        policies: policy names, compared on the same workload.
        workflows: workflows in the workload.
        concurrency: workflows in flight at once (closed loop).
        gpu_kv_tokens: GPU KV capacity in tokens; ``None`` = half the workload's
            concurrent working set (so the tier is under pressure), capped by the profile.
        host_kv_tokens: host tier capacity in tokens; ``None`` = 2 × the GPU tier
            (SGLang HiCache's default host-to-device ratio).
        seed: workload and scheduler seed.
        predictor: forecaster name for score-based policies (``markov``, ``oracle``, …).
        train_workflows: workflows (from another seed) the predictor is fitted on.
        hardware / model: sim profiles.
        block_size: tokens per KV block.
        horizon / gamma: score horizon K and decay.
        noise: ``lambda`` of the noise wrapper ``(1-lambda) P + lambda U`` on the
            predictor (``U`` a random distribution per forecast row, seeded by ``seed``).
        checkpoint: GraphSAGE checkpoint folder for ``predictor="graphsage"`` (read only
            when a policy uses forecasts).
        check_integrity: assert the KV manager's invariants after every engine step
            (slow; for debugging a policy).
    """

    app: str = "codegen"
    policies: tuple[str, ...] = ("lru", "lae", "he", "pbkv")
    workflows: int = 64
    concurrency: int = 16
    gpu_kv_tokens: int | None = None
    host_kv_tokens: int | None = None
    seed: int = 0
    predictor: str = "markov"
    train_workflows: int = 300
    hardware: str = "a6000-tp2"
    model: str = "qwen3-32b"
    block_size: int = 16
    horizon: int = 3
    gamma: float = 0.8
    noise: float = 0.0
    checkpoint: str | None = None
    check_integrity: bool = False


END_REASONS = ("end", "recursion_limit", "error", "aborted")
"""How a workflow may end (``WorkflowTerminated.reason``), in the table's order."""


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """Summary of one policy's run (times in simulated seconds).

    Latencies are over the workflows that ran to their end (``end`` or
    ``recursion_limit``); ``end_reasons`` counts every workflow by how it ended.
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
    recomputed_tokens: int
    throughput_workflows_per_s: float
    makespan_s: float
    kv: KVStatistics
    wall_s: float
    hit_timeline: tuple[tuple[float, float], ...] = field(default=(), repr=False)
    end_reasons: dict[str, int] = field(default_factory=dict)


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


def run_policy(
    workload: Sequence[Workflow],
    config: BenchConfig,
    policy: str,
    forecasters: Sequence[Forecaster],
    *,
    gpu_kv_tokens: int,
    step_graph_edges: tuple[tuple[str, str], ...] = (),
    on_outcome: Callable[[WorkflowOutcome], None] | None = None,
) -> PolicyResult:
    """Serve ``workload`` under ``policy`` in virtual time and summarise it.

    ``step_graph_edges`` is the app's call graph (needed by ``kvflow``); ``belady``
    reads the workload's future block keys directly.
    """
    cost = CostModel(load_hardware(config.hardware), load_model(config.model))
    bs = config.block_size
    gpu_blocks = gpu_kv_tokens // bs
    host_tokens = config.host_kv_tokens if config.host_kv_tokens is not None else 2 * gpu_kv_tokens
    kv_config = KVConfig(
        block_size=bs,
        gpu_capacity_blocks=gpu_blocks,
        host_capacity_blocks=host_tokens // bs,
        bytes_per_block=cost.kv_bytes_per_token * bs,
        policy=policy,
        horizon=config.horizon,
        gamma=config.gamma,
        bandwidth_bytes_per_s=cost.bandwidth_bytes_per_s,
    )
    uses_forecasts = get_policy(policy).uses_forecasts
    baseline = baseline_inputs(workload, config, policy, step_graph_edges)
    timeline: list[tuple[float, float]] = []

    async def main() -> list[WorkflowOutcome]:
        kv = KVManager(kv_config, trio.current_time, baseline)
        engine = SimEngine(kv, cost, SimConfig(check_integrity=config.check_integrity))
        outcomes = await serve_workflows(
            workload,
            engine=engine,
            kv=kv,
            forecasters=forecasters if uses_forecasts else (),
            concurrency=config.concurrency,
            on_outcome=on_outcome,
        )
        nonlocal kv_stats
        kv_stats = kv.statistics()
        return outcomes

    kv_stats: KVStatistics | None = None
    seed_scheduler(config.seed)
    started = time.perf_counter()
    outcomes = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    wall_s = time.perf_counter() - started
    assert kv_stats is not None
    by_id = {w.workflow_id: w for w in workload}
    for o in outcomes:
        t = o.start_s
        for step, r in zip(by_id[o.workflow_id].steps, o.results, strict=False):
            t += step.gap_s + r.e2e_s  # invocations of a workflow run back to back
            timeline.append((t, r.cached_gpu_tokens / max(1, r.prompt_tokens)))
    timeline.sort()
    return summarise_outcomes(policy, config, outcomes, kv_stats, wall_s, timeline)


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
) -> PolicyResult:
    """Summarise one policy's run: latency percentiles over the workflows that ran to
    their end (``end`` or ``recursion_limit``; not ``error``/``aborted``), counts by end
    reason, mean TTFT over invocations, hit rates from the KV statistics, throughput
    over the makespan.

    Times are in whatever clock the run used (simulated or wall seconds).
    """
    ran = [o.latency_s for o in outcomes if o.reason in ("end", "recursion_limit")]
    latencies = np.array(ran or [np.nan])
    reasons = Counter(o.reason for o in outcomes)
    ttfts = np.array([r.ttft_s for o in outcomes for r in o.results])
    makespan = max(o.end_s for o in outcomes) - min(o.start_s for o in outcomes)
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
        recomputed_tokens=kv.computed_tokens,
        throughput_workflows_per_s=len(outcomes) / makespan if makespan > 0 else 0.0,
        makespan_s=makespan,
        kv=kv,
        wall_s=wall_s,
        hit_timeline=tuple(timeline),
        end_reasons={reason: reasons[reason] for reason in END_REASONS},
    )


def _check_fits(workload: Sequence[Workflow], gpu_kv_tokens: int, block_size: int) -> None:
    largest = max((s.prompt_tokens + s.output_tokens for w in workload for s in w.steps), default=0)
    if -(-largest // block_size) * block_size > gpu_kv_tokens:
        raise ValueError(
            f"GPU KV capacity of {gpu_kv_tokens:,} tokens cannot hold the workload's largest "
            f"request ({largest:,} prompt + output tokens); raise --gpu-kv-tokens"
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
    graph = CallGraph(agents, app_edges)

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
    """Run every policy of ``config`` on one workload.

    Returns:
        The per-policy results (in ``config.policies`` order) and the GPU KV capacity in
        tokens that was used.

    Raises:
        ValueError: unknown app, policy, predictor or profile name.
    """
    from pbkv.examples import get_app  # a registered name or a user's "module:attribute"

    for name in config.policies:
        get_policy(name)
    app = get_app(config.app)
    workload = app.generate(config.workflows, config.seed)
    forecasters: list[Forecaster] = []
    if any(get_policy(name).uses_forecasts for name in config.policies):
        train = app.generate(config.train_workflows, config.seed + 10_000)
        forecasters = build_forecasters(config, app.agents, app.edges, workload, train)
    gpu_tokens = config.gpu_kv_tokens or gpu_tokens_for(workload, config.concurrency)
    cost = CostModel(load_hardware(config.hardware), load_model(config.model))
    gpu_tokens = min(gpu_tokens, cost.gpu_kv_capacity_tokens)
    _check_fits(workload, gpu_tokens, config.block_size)
    results = []
    for policy in config.policies:
        callback = None if on_outcome is None else (lambda o, p=policy: on_outcome(p, o))
        results.append(
            run_policy(
                workload,
                config,
                policy,
                forecasters,
                gpu_kv_tokens=gpu_tokens,
                step_graph_edges=tuple(app.edges),
                on_outcome=callback,
            )
        )
    return results, gpu_tokens
