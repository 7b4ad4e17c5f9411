"""One path (§7.5): what an app embedding pbkv runs is what ``pbkv bench`` measures."""

import pytest
import trio
import trio.testing

import pbkv
from pbkv.bench.compare import BenchConfig, run_bench
from pbkv.examples import get_app
from pbkv.live.build import RuntimeConfig, default_forecasters


def live_outcomes(app_name: str, n: int, concurrency: int, gpu_kv_tokens: int, policy: str):
    app = get_app(app_name)

    async def main():
        async with pbkv.open_runtime(
            engine="sim", policy=policy, gpu_kv_tokens=gpu_kv_tokens
        ) as runtime:
            tasks = [app.task(0, i) for i in range(n)]
            ids = [f"{app.name}-0-{i}" for i in range(n)]
            outcomes = await pbkv.serve_app(
                runtime, app, tasks, concurrency=concurrency, workflow_ids=ids
            )
            return outcomes, runtime.statistics().kv

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize("policy", ["pbkv", "lru"])
def test_open_runtime_with_defaults_gives_the_bench_rows_figures(policy):
    n, concurrency = 12, 6
    run = run_bench(
        BenchConfig(app="hover", policies=(policy,), workflows=n, concurrency=concurrency),
        bounds=False,
    )
    [row] = run.results
    outcomes, kv = live_outcomes("hover", n, concurrency, run.gpu_kv_tokens, policy)
    latencies = [o.end_s - o.start_s for o in outcomes if o.reason in ("end", "recursion_limit")]
    assert len(outcomes) == row.workflows == n
    assert sum(latencies) / len(latencies) == pytest.approx(row.mean_latency_s, rel=1e-12)
    assert kv.gpu_hit_rate == pytest.approx(row.gpu_hit_rate, rel=1e-12)
    assert kv.computed_tokens + kv.resumed_computed_tokens == row.recomputed_tokens


def test_pbkv_defaults_are_the_workflow_scheduler_and_the_online_predictor():
    config = RuntimeConfig(policy="pbkv")
    assert config.resolved_scheduler == "workflow"
    assert config.resolved_predictor == "online"
    assert [f.name for f in default_forecasters(config)] == ["online"]
    lru = RuntimeConfig(policy="lru")
    assert (lru.resolved_scheduler, lru.resolved_predictor) == ("fcfs", "none")
    assert default_forecasters(lru) == []
    assert RuntimeConfig(policy="pbkv", scheduler="fcfs", predictor="none").resolved_scheduler == (
        "fcfs"
    )
    with pytest.raises(ValueError, match="unknown predictor 'markov'"):
        RuntimeConfig(predictor="markov")
    with pytest.raises(ValueError, match="unknown scheduler 'lifo'"):
        RuntimeConfig(scheduler="lifo")


async def test_the_online_predictor_learns_from_a_graph_app_run(autojump_clock):
    app = get_app("codegen")
    async with pbkv.open_runtime(engine="sim", policy="pbkv") as runtime:
        await pbkv.serve_app(runtime, app, [app.task(0, i) for i in range(12)], concurrency=4)
        accuracy = runtime.predictor.online_accuracy()
        assert runtime.engine.scheduler.name == "workflow"
    assert accuracy.workflows == 12
    assert accuracy.predictions[0] > 12
    assert accuracy.top1[0] > 0.5


@pytest.mark.parametrize(("scale", "gap_model"), [(10.0, "bundled"), (1.0, "cited")])
def test_gaps_run_the_same_in_the_bench_and_in_open_runtime(scale, gap_model):
    n, concurrency = 8, 4
    config = BenchConfig(
        app="hover",
        policies=("pbkv",),
        workflows=n,
        concurrency=concurrency,
        gap_scale=scale,
        gap_model=gap_model,
    )
    run = run_bench(config, bounds=False)
    [row] = run.results
    app = get_app("hover", gap_model=gap_model)

    async def main():
        async with pbkv.open_runtime(
            engine="sim", policy="pbkv", gpu_kv_tokens=run.gpu_kv_tokens, gap_scale=scale
        ) as runtime:
            tasks = [app.task(0, i) for i in range(n)]
            ids = [f"{app.name}-0-{i}" for i in range(n)]
            return await pbkv.serve_app(
                runtime, app, tasks, concurrency=concurrency, workflow_ids=ids
            )

    outcomes = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    latencies = [o.end_s - o.start_s for o in outcomes]
    assert sum(latencies) / n == pytest.approx(row.mean_latency_s, rel=1e-12)
    plain = run_bench(
        BenchConfig(app="hover", policies=("pbkv",), workflows=n, concurrency=concurrency),
        bounds=False,
    ).results[0]
    assert abs(row.mean_latency_s - plain.mean_latency_s) > 0.1  # the gaps really changed
