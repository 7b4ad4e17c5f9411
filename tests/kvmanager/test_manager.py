"""Admission, host reloads, single-flight loads and conservative prefetch (§5.4)."""

import numpy as np
import pytest

from pbkv.kvmanager import AdmitRequest

from .conftest import make_manager
from .test_eviction import AGENTS, forecast, run


def test_admission_reserves_prompt_and_output(clock):
    mgr = make_manager(clock, "lru", gpu=10, host=0, block_size=2)
    adm = mgr.try_admit(AdmitRequest([1, 2], prompt_tokens=5, max_new_tokens=3))
    assert adm is not None
    assert len(adm.private_blocks) == 4  # ceil(8 / 2)
    assert adm.computed_tokens == 5
    mgr.check_integrity()
    mgr.release(adm)
    mgr.release(adm)  # idempotent
    assert mgr.tree.gpu.num_free == 10
    mgr.check_integrity()


def test_request_larger_than_gpu_is_an_error(clock):
    mgr = make_manager(clock, "lru", gpu=4)
    with pytest.raises(ValueError, match="needs 5 GPU blocks"):
        mgr.try_admit(AdmitRequest([1, 2, 3, 4, 5], 5, 0))


def test_full_gpu_of_leased_blocks_rejects_then_admits(clock):
    mgr = make_manager(clock, "lru", gpu=4, host=0)
    first = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 0))
    assert mgr.try_admit(AdmitRequest([7, 8], 2, 0)) is None
    assert mgr.statistics().rejected_admissions == 1
    mgr.commit(first, [1, 2, 3])
    mgr.release(first)
    assert mgr.try_admit(AdmitRequest([7, 8], 2, 0)) is not None
    mgr.check_integrity()


def test_host_hit_is_reloaded_not_recomputed(clock):
    mgr = make_manager(clock, "lru", gpu=4, host=8)
    run(mgr, clock, [1, 2, 3])
    run(mgr, clock, [7, 8, 9])  # needs 2 more blocks: the tail [2,3] is demoted to host
    adm = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 1))
    assert (adm.cached_gpu_tokens, adm.cached_host_tokens, adm.computed_tokens) == (1, 2, 0)
    assert len(adm.loads) == 1 and adm.loads[0].num_blocks == 2
    mgr.complete_load(adm.loads[0], ok=True)
    mgr.commit(adm, [1, 2, 3])
    mgr.release(adm)
    s = mgr.statistics()
    assert s.h2d_bytes == 200 and s.d2h_bytes >= 200
    mgr.check_integrity()


def test_concurrent_requests_join_one_load(clock):
    mgr = make_manager(clock, "lru", gpu=8, host=8)
    run(mgr, clock, [1, 2, 3])
    mgr.tree.evict("gpu", 3)
    a = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 0))
    b = mgr.try_admit(AdmitRequest([1, 2, 3, 4], 4, 0))
    assert a.loads == b.loads and len(a.loads) == 1
    mgr.check_integrity()
    mgr.complete_load(a.loads[0], ok=True)
    for adm in (a, b):
        mgr.commit(adm, [1, 2, 3, 4][: adm.request.prompt_tokens])
        mgr.release(adm)
    assert mgr.statistics().h2d_bytes == 300
    mgr.check_integrity()


def test_prefetch_only_into_free_or_retired_space(clock):
    mgr = make_manager(clock, "pbkv", gpu=4, host=16, bandwidth_bytes_per_s=1e9)
    mgr.on_workflow_started("w")
    mgr.on_forecast("w", forecast(coder=1.0), AGENTS)
    run(mgr, clock, [1, 2], "w", "coder")
    run(mgr, clock, [5, 6, 7, 8], "w", "tester")  # pushes the coder's [1,2] to host
    assert mgr.tree.match_prefix([1, 2]).host_blocks == 2
    # GPU is full of active cache: conservative prefetch must not displace it
    assert mgr.plan_prefetch(step_s=1.0) == []
    mgr.on_workflow_started("old")
    mgr.on_workflow_terminated("w")  # now the tester's blocks are retired
    mgr.on_workflow_started("w2")
    mgr.on_forecast("w2", forecast(coder=1.0), AGENTS)
    mgr.scores.touch(mgr.tree.match_prefix([1, 2]).path, "w2", "coder")
    loads = mgr.plan_prefetch(step_s=1.0)
    assert [load.num_blocks for load in loads] == [2]
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


def test_forecast_shape_is_checked(clock):
    mgr = make_manager(clock, "pbkv")
    with pytest.raises(ValueError, match="does not fit"):
        mgr.on_forecast("w", np.ones((3, 2)), AGENTS)


def test_commit_over_a_failed_load_raises_and_leaks_nothing(clock):
    mgr = make_manager(clock, "lru", gpu=8, host=8)
    run(mgr, clock, [1, 2, 3])
    mgr.tree.evict("gpu", 3)
    adm = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 1))
    mgr.complete_load(adm.loads[0], ok=False)
    with pytest.raises(ValueError, match="not on the GPU"):
        mgr.commit(adm, [1, 2, 3])
    mgr.release(adm)
    assert mgr.tree.private_blocks("gpu") == 0
    mgr.check_integrity()


def test_a_failed_demotion_copy_is_forgotten(clock):
    mgr = make_manager(clock, "lru", gpu=8, host=8)
    run(mgr, clock, [1, 2, 3])
    mgr.tree.evict("gpu", 3)  # demoted: the engine's device-to-host copy then fails
    host_blocks = set(mgr.tree.match_prefix([1, 2, 3]).node.host_blocks)
    assert mgr.discard_host_blocks(host_blocks) == 1
    assert mgr.tree.match_prefix([1, 2, 3]).host_blocks == 0
    assert mgr.tree.nodes() == []
    mgr.check_integrity()
