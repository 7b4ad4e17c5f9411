"""Prefetch planning (§5.4): budget, idle space only, single-flight, per-policy modes."""

from .conftest import make_manager
from .test_eviction import AGENTS, forecast, run


def test_prefetch_only_into_free_or_retired_space(clock):
    mgr = make_manager(clock, "pbkv", gpu=4, host=16, bandwidth_bytes_per_s=1e9)
    mgr.on_workflow_started("w")
    mgr.on_forecast("w", forecast(coder=1.0), AGENTS)
    run(mgr, clock, [1, 2], "w", "coder")
    run(mgr, clock, [5, 6, 7, 8], "w", "tester")  # pushes the coder's [1,2] to host
    assert mgr.tree.match_prefix([1, 2]).host_blocks == 2
    # GPU is full of active cache: conservative prefetch must not displace it, and does
    # not even scan the frontier for candidates
    scanned = []
    frontier = mgr.prefetcher._frontier
    mgr.prefetcher._frontier = lambda: scanned.append(1) or frontier()
    assert mgr.plan_prefetch(step_s=1.0) == []
    assert scanned == []
    mgr.on_workflow_started("old")
    mgr.on_workflow_terminated("w")  # now the tester's blocks are retired
    mgr.on_workflow_started("w2")
    mgr.on_forecast("w2", forecast(coder=1.0), AGENTS)
    mgr.scores.touch(mgr.tree.match_prefix([1, 2]).path, "w2", "coder")
    loads = mgr.plan_prefetch(step_s=1.0)
    assert [load.num_blocks for load in loads] == [2] and scanned == [1]
    assert mgr.tree.counters.evicted_retired_blocks == 2
    assert mgr.tree.counters.evicted_active_blocks == 2  # only the earlier demand eviction
    mgr.complete_load(loads[0], ok=True)
    run(mgr, clock, [1, 2], "w2", "coder")
    s = mgr.statistics()
    assert (s.prefetch_issued_blocks, s.prefetch_used_blocks) == (2, 2)
    mgr.check_integrity()


def test_prefetch_budget_is_bandwidth_bound(clock):
    # 100 bytes per block at 300 B/s over a 1 s step: at most 3 blocks
    mgr = make_manager(clock, "pbkv", gpu=16, host=16, bandwidth_bytes_per_s=300.0)
    mgr.on_workflow_started("w")
    mgr.on_forecast("w", forecast(coder=1.0), AGENTS)
    run(mgr, clock, [1, 2, 3, 4, 5], "w", "coder")
    mgr.tree.evict("gpu", 5)
    loads = mgr.plan_prefetch(step_s=1.0)
    assert sum(load.num_blocks for load in loads) == 3
    for load in loads:
        mgr.complete_load(load, ok=True)
    assert mgr.tree.match_prefix([1, 2, 3, 4, 5]).gpu_blocks == 3
    mgr.check_integrity()


def test_lru_and_he_never_prefetch(clock):
    for policy in ("lru", "lae", "he"):
        mgr = make_manager(clock, policy, gpu=8, host=8)
        mgr.on_forecast("w", forecast(coder=1.0), AGENTS)
        run(mgr, clock, [1, 2], "w", "coder")
        mgr.tree.evict("gpu", 2)
        assert mgr.plan_prefetch(step_s=1.0) == []
