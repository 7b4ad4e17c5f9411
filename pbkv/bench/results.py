"""What a bench reports: one :class:`PolicyResult` per row, summarised from its
workflows' outcomes and the KV statistics, the :class:`Bounds` beside them, and the
:class:`BenchRun` holding both."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pbkv.actors.events import RAN_TO_END
from pbkv.actors.workflow import WorkflowOutcome
from pbkv.bench.config import BenchConfig
from pbkv.kvmanager import KVStatistics, get_policy

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
            workflows back can go below it (docs/design.md, "uncontested").
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


def row_name(result: PolicyResult) -> str:
    """Return ``policy:scheduler`` for a row (how tables and bounds name it)."""
    return f"{result.policy}:{result.scheduler}"


def baseline_result(results: Sequence[PolicyResult]) -> PolicyResult:
    """Return the row ratios are taken against: the first ``lru`` row, else the first."""
    return next((r for r in results if r.policy == "lru"), results[0])


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
