"""Multi-replica study: placement x eviction on N sim replicas in virtual time (§7.6, §9).

N replicas, each a full pbkv runtime (:func:`~pbkv.live.build.open_runtime` over
:func:`~pbkv.live.build.build_engine`, ``engine="sim"``), run in one process under one
``trio.testing.MockClock``. Workflows of a bundled app arrive open loop (Poisson); each
request is placed by the same placement code the Dynamo router service runs
(:mod:`pbkv.integrations.dynamo.placement`), seeing each replica as Dynamo's router
does: the cached overlap its KV events report (read here from the replica's radix tree,
i.e. events delivered at once) and the blocks in flight there. A workflow holds one
session on every replica it has run on, ended when the workflow ends (Dynamo's
``session_final``), as a pbkv worker behind Dynamo holds it.

Run: ``python -m pbkv.bench.placement --app hover --replicas 2,4,8``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

import numpy as np
import trio
import trio.testing

from pbkv.actors.events import RAN_TO_END
from pbkv.actors.workload import Step, Workflow
from pbkv.bench.config import BenchConfig
from pbkv.bench.forecasters import row_forecasters
from pbkv.bench.row import runtime_config
from pbkv.bench.workload import gpu_tokens_for
from pbkv.engines.base import GenerateResult
from pbkv.integrations.dynamo.placement import (
    PLACEMENTS,
    InFlight,
    Placement,
    PlacementRequest,
    ReplicaView,
    blocks_of,
    make_placement,
)
from pbkv.kvmanager import AccessLog, block_keys, ceiling_hits
from pbkv.live.build import build_engine, default_scheduler, open_runtime
from pbkv.live.chat import raw_format
from pbkv.live.driver import EMPTY_OUTPUT_TOKEN, admitted_call
from pbkv.live.session import CallFailed, Runtime, Simulated, WorkflowSession
from pbkv.runtime import now_s

log = logging.getLogger(__name__)

EVICTIONS = ("lru", "pbkv")
"""Replica cache policies the study crosses placements with (each with its own default
scheduler and forecaster: ``pbkv`` is what ``open_runtime`` runs by default)."""


@dataclass(frozen=True, slots=True)
class StudyConfig:
    """One study: an app, a replica count, the placements and evictions compared.

    Args:
        app: bundled app name (``hover``, ``taubench``, ...).
        replicas: replicas in the cluster.
        placements: placement names (:data:`~pbkv.integrations.dynamo.placement.PLACEMENTS`).
        evictions: replica cache policies.
        workflows_per_replica: workflows in the workload per replica.
        rate_per_replica: Poisson arrivals per second per replica (open loop).
        gpu_kv_tokens: each replica's GPU KV tier in tokens; ``None`` = half the working
            set of ``busy_workflows`` workflows (as ``pbkv bench`` sizes it).
        busy_workflows: workflows a replica is sized for when ``gpu_kv_tokens`` is ``None``.
        host_kv_tokens: each replica's host tier; ``None`` = 2 x the GPU tier.
        seed: workload, arrivals and tie-break seed.
        hardware / model / block_size: sim profiles and block size.
    """

    app: str = "hover"
    replicas: int = 4
    placements: tuple[str, ...] = tuple(PLACEMENTS)
    evictions: tuple[str, ...] = EVICTIONS
    workflows_per_replica: int = 32
    rate_per_replica: float = 0.25
    gpu_kv_tokens: int | None = None
    busy_workflows: int = 16
    host_kv_tokens: int | None = None
    seed: int = 0
    hardware: str = "a6000-tp2"
    model: str = "qwen3-32b"
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("replicas", "workflows_per_replica", "busy_workflows", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.rate_per_replica > 0:
            raise ValueError(f"rate_per_replica must be > 0, got {self.rate_per_replica}")
        for name in self.placements:
            make_placement(name)

    def bench_config(self) -> BenchConfig:
        """Return the single-replica bench config each replica's runtime is built from."""
        return BenchConfig(
            app=self.app,
            seed=self.seed,
            hardware=self.hardware,
            model=self.model,
            block_size=self.block_size,
            host_kv_tokens=self.host_kv_tokens,
            open_loop=True,
        )


@dataclass(frozen=True, slots=True)
class CellResult:
    """One placement x eviction run (times in simulated seconds).

    Attributes:
        mean/p50/p99_latency_s: workflow latency from arrival to end, over the workflows
            that ran to their end.
        mean_ttft_s: per request, submit to first token.
        makespan_s: first arrival to last end.
        gpu/host/total_hit_rate: cached prompt tokens over prompt tokens, all replicas.
        recomputed_tokens: prompt tokens prefilled (a retracted request's again too).
        switches: requests placed on another replica than their workflow's previous one.
        moved_workflows: workflows that ran on more than one replica.
        load_imbalance: max / mean of the replicas' modelled busy seconds.
        ceiling_hit_rate: infinite single-cache hit rate over the same requests.
        failed_workflows: workflows that ended ``error``.
        wall_s: real seconds the run took.
    """

    placement: str
    eviction: str
    replicas: int
    workflows: int
    mean_latency_s: float
    p50_latency_s: float
    p99_latency_s: float
    mean_ttft_s: float
    makespan_s: float
    gpu_hit_rate: float
    host_hit_rate: float
    total_hit_rate: float
    recomputed_tokens: int
    switches: int
    moved_workflows: int
    load_imbalance: float
    ceiling_hit_rate: float
    failed_workflows: int
    wall_s: float


@dataclass(frozen=True, slots=True)
class _Outcome:
    workflow_id: str
    reason: str
    start_s: float
    end_s: float
    results: tuple[GenerateResult, ...]


def study_workload(config: StudyConfig) -> list[Workflow]:
    """Return the app's workload for ``config`` with Poisson arrival times.

    ``workflows_per_replica * replicas`` workflows of seed ``config.seed``; arrivals at
    ``rate_per_replica * replicas`` per second, gaps drawn from the same seed.
    """
    from pbkv.examples import get_app

    n = config.workflows_per_replica * config.replicas
    workload = get_app(config.app).generate(n, config.seed)
    rng = np.random.default_rng(config.seed)
    gaps = rng.exponential(1.0 / (config.rate_per_replica * config.replicas), size=len(workload))
    arrivals = np.cumsum(gaps) - gaps[0]
    return [
        dataclasses.replace(w, arrival_s=float(a)) for w, a in zip(workload, arrivals, strict=True)
    ]


class SimCluster:
    """N runtimes behind one placement: serves workflows as a Dynamo frontend would.

    Args:
        runtimes: the replicas, by index.
        placement: the placement policy.
        block_size: the replicas' block size (for the views' block counts).
        app: the app name requests report.
    """

    def __init__(
        self, runtimes: Sequence[Runtime], placement: Placement, block_size: int, app: str
    ) -> None:
        self.runtimes = list(runtimes)
        self.placement = placement
        self.block_size = block_size
        self.app = app
        self.in_flight = InFlight()

    def views(self, keys: list[int], namespace: str) -> list[ReplicaView]:
        """Return each replica's view for a prompt of ``keys``. Does not modify anything."""
        views = []
        for i, rt in enumerate(self.runtimes):
            gpu, host = rt.kv.tree.peek_prefix(keys, namespace)
            views.append(ReplicaView(i, gpu, host, self.in_flight.of(i)))
        return views

    async def serve(self, workload: Sequence[Workflow]) -> list[_Outcome]:
        """Run every workflow from its arrival; return the outcomes in completion order."""
        outcomes: list[_Outcome] = []
        t0 = now_s()

        async def one(wf: Workflow) -> None:
            await trio.sleep_until(t0 + wf.arrival_s)
            outcomes.append(await self.run_workflow(wf))

        async with trio.open_nursery() as nursery:
            for wf in workload:
                nursery.start_soon(one, wf)
        return outcomes

    async def run_workflow(self, wf: Workflow) -> _Outcome:
        """Serve ``wf``'s steps, each on the replica the placement picks."""
        start = now_s()
        sessions: dict[int, WorkflowSession] = {}
        results: list[GenerateResult] = []
        reason = wf.end_reason
        try:
            for step in wf.steps:
                if step.gap_s > 0:
                    await trio.sleep(step.gap_s)
                result = await self._step(wf, step, sessions)
                if result is None:
                    reason = "error"
                    break
                results.append(result)
        finally:
            with trio.CancelScope(shield=True):
                for session in sessions.values():
                    await session.end(reason if reason in RAN_TO_END else "error")  # type: ignore[arg-type]
                self.placement.finish(wf.workflow_id)
        return _Outcome(wf.workflow_id, reason, start, now_s(), tuple(results))

    async def _step(
        self, wf: Workflow, step: Step, sessions: dict[int, WorkflowSession]
    ) -> GenerateResult | None:
        bs = self.block_size
        keys = block_keys(step.prompt_token_ids, bs, wf.tenant)
        output = step.output_token_ids or (EMPTY_OUTPUT_TOKEN,)
        request = PlacementRequest(
            wf.workflow_id,
            step.agent,
            blocks_of(step.prompt_tokens, bs),
            blocks_of(len(output), bs),
            self.app,
        )
        replica = self.placement.place(request, self.views(keys, wf.tenant)).replica
        session = sessions.get(replica)
        if session is None:
            session = sessions[replica] = await self.runtimes[replica].open_workflow(
                wf.workflow_id,
                app=wf.app,
                task_id=wf.task_id,
                task_text=wf.task_text,
                tenant=wf.tenant,
            )
        held = request.prompt_blocks + request.output_blocks
        self.in_flight.add(replica, held)
        try:
            reply = await admitted_call(
                session,
                step.agent,
                step.segments,
                max_new_tokens=len(output),
                simulated=Simulated(token_ids=output),
                context_tail=step.context_tail,
            )
        except CallFailed as exc:
            log.warning("workflow %s step %s failed: %s", wf.workflow_id, step.agent, exc)
            return None
        finally:
            self.in_flight.remove(replica, held)
        self.placement.done(request, replica, blocks_of(step.prompt_tokens + len(output), bs))
        return reply.result


def run_cell(
    workload: Sequence[Workflow],
    config: StudyConfig,
    placement_name: str,
    eviction: str,
    gpu_kv_tokens: int,
) -> CellResult:
    """Serve ``workload`` on ``config.replicas`` sim replicas under one placement and one
    eviction policy, in virtual time, and summarise it."""
    from pbkv.examples import get_app

    app = get_app(config.app)
    bench = config.bench_config()
    row = runtime_config(bench, eviction, default_scheduler(eviction), gpu_kv_tokens)
    access_log = AccessLog(config.block_size)
    placement = make_placement(placement_name, seed=config.seed)
    if hasattr(placement, "warm_start"):
        placement.warm_start(app.name, app.agents, app.edges)
    engines: list = []

    async def main() -> list[_Outcome]:
        async with AsyncExitStack() as stack:
            runtimes = []
            for i in range(config.replicas):
                built = build_engine(row, access_log=access_log)
                built = dataclasses.replace(built, chat=raw_format(), model_name=f"replica-{i}")
                chain = row_forecasters(bench, eviction, (), app.name, app.agents, app.edges)
                runtime = await stack.enter_async_context(
                    open_runtime(row, forecasters=chain, built=built)
                )
                runtimes.append(runtime)
                engines.append(built)
            cluster = SimCluster(runtimes, placement, config.block_size, app.name)
            return await cluster.serve(workload)

    started = time.perf_counter()
    outcomes = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    wall_s = time.perf_counter() - started
    return _summarise(
        outcomes, engines, placement, access_log, config, placement_name, eviction, wall_s
    )


def _summarise(
    outcomes: Sequence[_Outcome],
    engines: Sequence,
    placement: Placement,
    access_log: AccessLog,
    config: StudyConfig,
    placement_name: str,
    eviction: str,
    wall_s: float,
) -> CellResult:
    ran = [o.end_s - o.start_s for o in outcomes if o.reason in RAN_TO_END]
    latencies = np.array(ran or [np.nan])
    ttfts = [r.ttft_s for o in outcomes for r in o.results]
    stats = [b.kv.statistics() for b in engines]
    prompt = sum(s.prompt_tokens for s in stats)
    gpu = sum(s.cached_gpu_tokens for s in stats)
    host = sum(s.cached_host_tokens for s in stats)
    busy = np.array([b.engine.statistics().busy_s for b in engines])
    moves = placement.statistics()
    return CellResult(
        placement=placement_name,
        eviction=eviction,
        replicas=config.replicas,
        workflows=len(outcomes),
        mean_latency_s=float(latencies.mean()),
        p50_latency_s=float(np.percentile(latencies, 50)),
        p99_latency_s=float(np.percentile(latencies, 99)),
        mean_ttft_s=float(np.mean(ttfts)) if ttfts else 0.0,
        makespan_s=max(o.end_s for o in outcomes) - min(o.start_s for o in outcomes),
        gpu_hit_rate=gpu / prompt if prompt else 0.0,
        host_hit_rate=host / prompt if prompt else 0.0,
        total_hit_rate=(gpu + host) / prompt if prompt else 0.0,
        recomputed_tokens=sum(s.computed_tokens + s.resumed_computed_tokens for s in stats),
        switches=moves.switches,
        moved_workflows=moves.moved_workflows,
        load_imbalance=float(busy.max() / busy.mean()) if busy.mean() > 0 else 1.0,
        ceiling_hit_rate=access_log.hit_rate(ceiling_hits(access_log)),
        failed_workflows=sum(o.reason == "error" for o in outcomes),
        wall_s=wall_s,
    )


def replica_gpu_tokens(config: StudyConfig, workload: Sequence[Workflow]) -> int:
    """Return each replica's GPU tier: ``config.gpu_kv_tokens``, else half the working
    set of ``busy_workflows`` workflows (:func:`~pbkv.bench.compare.gpu_tokens_for`)."""
    if config.gpu_kv_tokens is not None:
        return config.gpu_kv_tokens
    return gpu_tokens_for(workload, config.busy_workflows)


def run_study(config: StudyConfig, *, progress: bool = False) -> list[CellResult]:
    """Run every eviction x placement of ``config`` on one workload; return the cells in
    order (evictions outer, placements inner)."""
    workload = study_workload(config)
    gpu_tokens = replica_gpu_tokens(config, workload)
    cells = []
    for eviction in config.evictions:
        for name in config.placements:
            cell = run_cell(workload, config, name, eviction, gpu_tokens)
            if progress:
                print(
                    f"  {config.app} x{config.replicas} {eviction:5} {name:12} "
                    f"{cell.mean_latency_s:8.2f} s  ({cell.wall_s:.0f} s wall)",
                    file=sys.stderr,
                    flush=True,
                )
            cells.append(cell)
    return cells


def markdown_table(cells: Sequence[CellResult]) -> str:
    """Return the cells as one markdown table, with each row's speedup in mean latency
    over round-robin and over ``kv`` under the same eviction and replica count."""
    head = (
        "| replicas | eviction | placement | mean lat s | p50 s | p99 s | TTFT s | makespan s "
        "| GPU hit % | host hit % | total hit % | ceiling % | recomputed tok | switches "
        "| moved wf | imbalance | vs round-robin | vs kv |\n"
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    by_key = {(c.replicas, c.eviction, c.placement): c for c in cells}
    rows = [head]
    for c in cells:
        rr = by_key.get((c.replicas, c.eviction, "round-robin"))
        kv = by_key.get((c.replicas, c.eviction, "kv"))
        rows.append(
            f"| {c.replicas} | {c.eviction} | {c.placement} | {c.mean_latency_s:.2f} "
            f"| {c.p50_latency_s:.2f} | {c.p99_latency_s:.2f} | {c.mean_ttft_s:.3f} "
            f"| {c.makespan_s:.1f} | {100 * c.gpu_hit_rate:.1f} | {100 * c.host_hit_rate:.1f} "
            f"| {100 * c.total_hit_rate:.1f} | {100 * c.ceiling_hit_rate:.1f} "
            f"| {c.recomputed_tokens:,} | {c.switches} | {c.moved_workflows} "
            f"| {c.load_imbalance:.2f} | {_speedup(rr, c)} | {_speedup(kv, c)} |"
        )
    return "\n".join(rows)


def _speedup(base: CellResult | None, cell: CellResult) -> str:
    if base is None or not cell.mean_latency_s:
        return "-"
    return f"{base.mean_latency_s / cell.mean_latency_s:.3f}x"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the study from the command line; print the markdown table."""
    parser = argparse.ArgumentParser(
        prog="python -m pbkv.bench.placement",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    defaults = StudyConfig()
    parser.add_argument("--app", action="append", help="app (repeatable); default hover")
    parser.add_argument("--replicas", default="2,4,8", help="replica counts, comma-separated")
    parser.add_argument("--placements", default=",".join(defaults.placements))
    parser.add_argument("--evictions", default=",".join(defaults.evictions))
    parser.add_argument("--workflows-per-replica", type=int, default=defaults.workflows_per_replica)
    parser.add_argument("--rate-per-replica", type=float, default=defaults.rate_per_replica)
    parser.add_argument("--gpu-kv-tokens", type=int, default=None)
    parser.add_argument("--busy-workflows", type=int, default=defaults.busy_workflows)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--hardware", default=defaults.hardware)
    parser.add_argument("--json", dest="json_path", default=None, help="also write the cells")
    args = parser.parse_args(argv)
    cells: list[CellResult] = []
    for app in args.app or ["hover"]:
        for n in (int(x) for x in args.replicas.split(",")):
            config = StudyConfig(
                app=app,
                replicas=n,
                placements=tuple(p.strip() for p in args.placements.split(",")),
                evictions=tuple(e.strip() for e in args.evictions.split(",")),
                workflows_per_replica=args.workflows_per_replica,
                rate_per_replica=args.rate_per_replica,
                gpu_kv_tokens=args.gpu_kv_tokens,
                busy_workflows=args.busy_workflows,
                seed=args.seed,
                hardware=args.hardware,
            )
            app_cells = run_study(config, progress=True)
            print(f"\n### {app}, {n} replicas\n\n{markdown_table(app_cells)}\n", flush=True)
            cells += app_cells
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump([dataclasses.asdict(c) for c in cells], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
