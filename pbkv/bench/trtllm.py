"""Engine-owned vs owned cache on one workload: TensorRT-LLM's default, pbkv steering
TensorRT-LLM, and pbkv owning the cache (§7.3; ``pbkv bench --engine trtllm-sim``).

The TensorRT-LLM rows run the adapter (:class:`~pbkv.engines.trtllm.TrtllmEngine`)
over :class:`~pbkv.engines.trtllm.SimLLM`: the fake 1.2 block manager as allocator,
the sim engine's cost model for step times, in virtual time. ``trtllm-default`` sends
no retention configs (every block at priority 35: LRU); ``pbkv-steered`` sends PBKV
bands and touch requests; ``pbkv-owned`` is the ``sim`` engine with policy ``pbkv``.
Same workload, block size, GPU and host capacities, predictor and seed for all three.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import trio
import trio.testing

from pbkv.actors.serve import serve_workflows
from pbkv.actors.workflow import WorkflowOutcome
from pbkv.actors.workload import Workflow
from pbkv.bench.config import BenchConfig
from pbkv.bench.forecasters import build_forecasters
from pbkv.bench.results import PolicyResult, summarise_outcomes
from pbkv.bench.row import run_policy
from pbkv.bench.workload import check_fits, check_prompts, gpu_tokens_for
from pbkv.engines.sim.costmodel import CostModel
from pbkv.engines.sim.engine import SimConfig
from pbkv.engines.sim.profile import load_hardware, load_model
from pbkv.kvmanager import KVStatistics
from pbkv.runtime import seed_scheduler

if TYPE_CHECKING:  # the adapter is imported only where a trtllm row runs
    from pbkv.engines.trtllm.engine import TrtllmStatistics

#: Rows of the trtllm-sim comparison, in print order.
TRTLLM_MODES = ("trtllm-default", "pbkv-steered", "pbkv-owned")


@dataclasses.dataclass(frozen=True, slots=True)
class TrtllmRun:
    """One TensorRT-LLM row: the summary and what the adapter and fake did."""

    result: PolicyResult
    adapter: TrtllmStatistics
    fake: object


def run_trtllm_sim(
    workload: Sequence[Workflow],
    config: BenchConfig,
    *,
    steered: bool,
    forecasters: Sequence,
    gpu_kv_tokens: int,
    on_outcome: Callable[[WorkflowOutcome], None] | None = None,
) -> TrtllmRun:
    """Serve ``workload`` through the adapter over ``SimLLM`` in virtual time."""
    from pbkv.engines.trtllm import (
        BlockManagerConfig,
        FakeBlockManager,
        MirrorKV,
        SimLLM,
        SimLLMConfig,
        TrtllmEngine,
        TrtllmEngineConfig,
    )

    cost = CostModel(load_hardware(config.hardware), load_model(config.model))
    bs = config.block_size
    host_tokens = config.host_kv_tokens if config.host_kv_tokens is not None else 2 * gpu_kv_tokens
    sim = SimConfig()
    policy = "pbkv" if steered else "lru"
    holder: dict[str, object] = {}

    async def main() -> list[WorkflowOutcome]:
        manager = FakeBlockManager(
            BlockManagerConfig(
                tokens_per_block=bs,
                gpu_blocks=gpu_kv_tokens // bs,
                host_blocks=host_tokens // bs,
                event_buffer_max_size=1 << 16,
            ),
            trio.current_time,
        )
        llm = SimLLM(manager, cost, SimLLMConfig(sim.max_batch_size, sim.max_prefill_tokens))
        kv = MirrorKV(policy, tokens_per_block=bs, horizon=config.horizon, gamma=config.gamma)
        engine = TrtllmEngine(
            llm, kv, TrtllmEngineConfig(tokens_per_block=bs, max_batch_size=sim.max_batch_size)
        )
        outcomes = await serve_workflows(
            workload,
            engine=engine,
            kv=kv,  # type: ignore[arg-type]  # the engine-owned KV manager (lifecycle calls)
            forecasters=forecasters if steered else (),
            concurrency=config.concurrency,
            on_outcome=on_outcome,
        )
        holder.update(adapter=engine.statistics(), fake=manager.counters, kv=kv)
        holder["bpb"] = llm.bytes_per_block
        return outcomes

    seed_scheduler(config.seed)
    started = time.perf_counter()
    outcomes = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    wall_s = time.perf_counter() - started
    stats = _kv_statistics(policy, outcomes, holder)
    result = summarise_outcomes(policy, config, outcomes, stats, wall_s, [])
    label = "pbkv-steered" if steered else "trtllm-default"
    return TrtllmRun(dataclasses.replace(result, policy=label), holder["adapter"], holder["fake"])


def _kv_statistics(policy: str, outcomes: list[WorkflowOutcome], holder: dict) -> KVStatistics:
    """Hit counts over the workload's own requests (touches excluded), from the results."""
    results = [r for o in outcomes for r in o.results]
    fake, adapter, bpb = holder["fake"], holder["adapter"], int(holder["bpb"])
    prompt = sum(r.prompt_tokens for r in results)
    gpu = sum(r.cached_gpu_tokens for r in results)
    host = sum(r.cached_host_tokens for r in results)
    return KVStatistics(
        policy=policy,
        requests=len(results),
        prompt_tokens=prompt,
        cached_gpu_tokens=gpu,
        cached_host_tokens=host,
        computed_tokens=prompt - gpu - host,
        evicted_retired_blocks=0,
        evicted_active_blocks=0,
        demoted_blocks=fake.offloaded_blocks,
        dropped_blocks=fake.dropped_blocks,
        h2d_bytes=fake.onboarded_blocks * bpb,
        d2h_bytes=fake.offloaded_blocks * bpb,
        prefetch_issued_blocks=adapter.touch_blocks_onboarded,
        prefetch_used_blocks=0,
        prefetch_wasted_blocks=0,
        rejected_admissions=0,
        score_refreshed_nodes=holder["kv"].scores.refreshed_nodes,
    )


def compare_trtllm(
    config: BenchConfig,
    *,
    on_outcome: Callable[[str, WorkflowOutcome], None] | None = None,
) -> tuple[list[PolicyResult], int, list[TrtllmRun]]:
    """Run the three :data:`TRTLLM_MODES` on one workload.

    Returns:
        The results (in :data:`TRTLLM_MODES` order), the GPU KV tokens used, and the
        two TensorRT-LLM runs' adapter and fake statistics.
    """
    from pbkv.examples import get_app

    app = get_app(config.app)
    workload = app.generate(config.workflows, config.seed)
    check_prompts(workload, config.app)
    train = app.generate(config.train_workflows, config.seed + 10_000)
    forecasters = build_forecasters(config, app.agents, app.edges, workload, train)
    cost = CostModel(load_hardware(config.hardware), load_model(config.model))
    gpu_tokens = min(
        config.gpu_kv_tokens or gpu_tokens_for(workload, config.concurrency),
        cost.gpu_kv_capacity_tokens,
    )
    check_fits(workload, gpu_tokens, config, cost)

    def callback(mode: str) -> Callable[[WorkflowOutcome], None] | None:
        return None if on_outcome is None else (lambda o: on_outcome(mode, o))

    runs = [
        run_trtllm_sim(
            workload,
            config,
            steered=steered,
            forecasters=forecasters,
            gpu_kv_tokens=gpu_tokens,
            on_outcome=callback(mode),
        )
        for mode, steered in (("trtllm-default", False), ("pbkv-steered", True))
    ]
    owned = run_policy(
        workload,
        config,
        "pbkv",
        forecasters,
        gpu_kv_tokens=gpu_tokens,
        step_graph_edges=tuple(app.edges),
        on_outcome=callback("pbkv-owned"),
    )
    results = [r.result for r in runs] + [dataclasses.replace(owned, policy="pbkv-owned")]
    return results, gpu_tokens, runs


def steering_summary(results: Sequence[PolicyResult], runs: Sequence[TrtllmRun]) -> list[str]:
    """Lines under the table: steering's loss against owning the cache, its gain over
    TensorRT-LLM's default, and what the adapter did (retention configs, touches, events)."""
    by = {r.policy: r for r in results}
    default, steered, owned = by["trtllm-default"], by["pbkv-steered"], by["pbkv-owned"]

    def pct(a: float, b: float) -> str:
        return f"{100 * (a / b - 1):+.1f}%" if b else "n/a"

    def versus(a: PolicyResult, b: PolicyResult) -> str:
        return (
            f"mean latency {pct(a.mean_latency_s, b.mean_latency_s)}, "
            f"GPU hit {100 * (a.gpu_hit_rate - b.gpu_hit_rate):+.1f} pt, "
            f"total hit {100 * (_total(a) - _total(b)):+.1f} pt, "
            f"recomputed tokens {pct(a.recomputed_tokens, b.recomputed_tokens)}"
        )

    lines = [
        f"gain of steering over trtllm default: {versus(steered, default)}",
        f"steering loss vs pbkv owning the cache: {versus(steered, owned)}",
    ]
    for label, run in zip(("trtllm-default", "pbkv-steered"), runs, strict=True):
        a, m = run.adapter, run.adapter.mirror
        lines.append(
            f"{label}: {a.retention_configs} retention configs, touches "
            f"{a.touches_demote} demote / {a.touches_prefetch} prefetch "
            f"({a.touch_blocks_retagged} blocks re-tagged, "
            f"{a.touch_blocks_onboarded} onboarded, {a.touches_skipped_busy} skipped busy); "
            f"mirror {m.events} events, {m.gaps} gaps, {m.ghosts_dropped} ghosts"
        )
    return lines


def _total(r: PolicyResult) -> float:
    return r.gpu_hit_rate + r.host_hit_rate
