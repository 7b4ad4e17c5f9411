"""Open loop (issue 28 item 1): Poisson session arrivals, latency counted from arrival."""

import dataclasses
import json

import pytest

from pbkv.bench.compare import BenchConfig, poisson_arrivals, run_bench
from pbkv.bench.records import write_json

CLOSED = BenchConfig(app="codegen", policies=("lru",), workflows=8, concurrency=2)


def test_poisson_arrivals_are_seeded_and_start_at_zero():
    times = poisson_arrivals(5, rate=2.0, seed=3)
    assert times == poisson_arrivals(5, rate=2.0, seed=3)
    assert times[0] == 0.0 and times == sorted(times)
    assert times != poisson_arrivals(5, rate=2.0, seed=4)
    with pytest.raises(ValueError, match="rate must be > 0"):
        poisson_arrivals(5, rate=0.0, seed=0)


def test_open_loop_latency_includes_the_wait_for_a_slot():
    closed = run_bench(CLOSED, bounds=False).results[0]
    # everyone arrives at once; two slots: the others queue, and that wait counts
    burst = run_bench(dataclasses.replace(CLOSED, rate=1e9), bounds=False)
    opened = burst.results[0]
    assert burst.rate == 1e9
    assert opened.mean_latency_s > 1.5 * closed.mean_latency_s
    assert opened.max_latency_s == pytest.approx(opened.makespan_s, rel=1e-6)
    assert closed.max_latency_s < closed.makespan_s


def test_goodput_counts_the_workflows_within_the_slo():
    row = run_bench(dataclasses.replace(CLOSED, slo_s=1e9), bounds=False).results[0]
    assert row.goodput_workflows_per_s == pytest.approx(row.throughput_workflows_per_s)
    none = run_bench(dataclasses.replace(CLOSED, slo_s=1e-9), bounds=False).results[0]
    assert none.goodput_workflows_per_s == 0.0


def test_load_is_a_fraction_of_the_strongest_baselines_capacity():
    run = run_bench(dataclasses.replace(CLOSED, load=0.5), bounds=False)
    capacity = run_bench(
        dataclasses.replace(CLOSED, policies=("lru:workflow",)), bounds=False
    ).results[0]
    assert run.rate == pytest.approx(0.5 * capacity.throughput_workflows_per_s)
    with pytest.raises(ValueError, match="not both"):
        run_bench(dataclasses.replace(CLOSED, load=0.5, rate=1.0), bounds=False)


def test_the_json_records_the_rate_a_load_resolved_to(tmp_path):
    config = dataclasses.replace(CLOSED, load=0.5)
    run = run_bench(config, bounds=False)
    write_json(tmp_path / "open.json", config, run.gpu_kv_tokens, run.results, run=run)
    payload = json.loads((tmp_path / "open.json").read_text())
    assert payload["arrival_rate_workflows_per_s"] == pytest.approx(run.rate) and run.rate > 0
    assert payload["config"]["load"] == 0.5
