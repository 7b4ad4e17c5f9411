"""Bounds that bound every row (issue 28 item 6): MIN over each row's own access order."""

import pytest

from pbkv.bench.compare import BenchConfig, run_bench


@pytest.fixture(scope="module")
def run():
    config = BenchConfig(app="hover", workflows=16, concurrency=8)  # the four default rows
    return run_bench(config)


def test_min_over_its_own_order_bounds_every_rows_hits(run):
    assert [r.scheduler for r in run.results] == ["fcfs", "fcfs-balanced", "workflow", "workflow"]
    for r in run.results:
        assert r.min_total_hit_rate >= r.total_hit_rate - 1e-12, r.policy
        assert r.ceiling_hit_rate >= r.min_total_hit_rate - 1e-12, r.policy
        if r.policy != "pbkv":  # demand caching: MIN at the GPU's capacity bounds its GPU hits
            assert r.min_gpu_hit_rate >= r.gpu_hit_rate - 1e-12, r.policy
    assert run.bounds.ceiling_hit_rate == max(r.ceiling_hit_rate for r in run.results)


def test_the_table_labels_min_per_row(run):
    from pbkv.bench.report import min_per_row_line

    line = min_per_row_line(run.results)
    assert line.startswith("MIN over each row's own order, GPU/total hit%: lru:fcfs ")
    assert line.count("(row ") == len(run.results)
