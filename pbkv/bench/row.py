"""One bench row: a workload served under one ``policy:scheduler`` through the runtime an
app embeds (``open_runtime`` over the sim engine), in virtual time
(``MockClock(autojump_threshold=0)``, trio's scheduler seeded: the same seed gives the same
figures), and summarised as a :class:`~pbkv.bench.results.PolicyResult`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import trio
import trio.testing

from pbkv.actors.workflow import WorkflowOutcome
from pbkv.actors.workload import Workflow
from pbkv.bench.config import BenchConfig, resolve_spec
from pbkv.bench.forecasters import row_forecasters
from pbkv.bench.results import PolicyResult, summarise_outcomes
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.profile import load_hardware, load_model
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
    NO_PREDICTOR,
    ONLINE_PREDICTOR,
    RuntimeConfig,
    build_engine,
    open_runtime,
)
from pbkv.live.chat import raw_format
from pbkv.live.driver import serve_replays
from pbkv.predictor.base import Forecaster


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
