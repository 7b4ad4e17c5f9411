"""The multi-replica study in virtual time, at a size a test affords (pbkv/bench/placement.py)."""

import pytest

from pbkv.bench.placement import StudyConfig, markdown_table, run_study, study_workload

SMALL = StudyConfig(
    app="hover",
    replicas=2,
    evictions=("lru",),
    workflows_per_replica=3,
    rate_per_replica=0.5,
    busy_workflows=2,
)


@pytest.fixture(scope="module")
def cells():
    return {c.placement: c for c in run_study(SMALL)}


def test_arrivals_are_poisson_from_zero_at_the_cluster_rate():
    workload = study_workload(SMALL)
    arrivals = [w.arrival_s for w in workload]
    assert len(workload) == 6
    assert arrivals[0] == 0.0
    assert arrivals == sorted(arrivals)
    assert study_workload(SMALL) == workload  # the same seed, the same workload


def test_every_workflow_completes_under_every_placement(cells):
    assert list(cells) == ["round-robin", "kv", "kv-affinity", "pbkv"]
    for c in cells.values():
        assert (c.workflows, c.failed_workflows, c.replicas) == (6, 0, 2)
        assert c.p50_latency_s <= c.p99_latency_s <= c.makespan_s
        assert c.gpu_hit_rate + c.host_hit_rate == pytest.approx(c.total_hit_rate)
        assert c.total_hit_rate <= c.ceiling_hit_rate + 1e-9
        assert c.load_imbalance >= 1.0


def test_round_robin_scatters_workflows_and_affinity_keeps_them(cells):
    rr, affinity = cells["round-robin"], cells["kv-affinity"]
    assert rr.moved_workflows == 6 and rr.switches > 6
    assert (affinity.switches, affinity.moved_workflows) == (0, 0)
    assert rr.total_hit_rate < affinity.total_hit_rate
    assert rr.recomputed_tokens > affinity.recomputed_tokens


def test_the_table_has_a_row_per_cell_and_speedups_over_round_robin(cells):
    table = markdown_table(list(cells.values())).splitlines()
    assert len(table) == 2 + 4
    assert table[2].startswith("| 2 | lru | round-robin |")
    assert table[2].endswith("| 1.000x | " + _ratio(cells["kv"], cells["round-robin"]) + " |")


def _ratio(base, cell):
    return f"{base.mean_latency_s / cell.mean_latency_s:.3f}x"


def test_an_unknown_placement_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="unknown placement 'nearest'"):
        StudyConfig(placements=("nearest",))
