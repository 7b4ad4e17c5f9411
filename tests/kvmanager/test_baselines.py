"""Exact eviction orders of the kvflow and belady-est baselines on hand-built traces (§5.2)."""

import pytest

from pbkv.kvmanager import (
    AdmitRequest,
    BaselineInputs,
    FutureStep,
    KVConfig,
    KVManager,
    StepGraph,
)
from pbkv.kvmanager.kvflow import UNREACHABLE

from .test_eviction import eviction_order

EDGES = (
    ("planner", "coder"),
    ("coder", "tester"),
    ("tester", "analyzer"),
    ("tester", "END"),
    ("analyzer", "coder"),
)


def manager(clock, policy, baseline, gpu=16):
    cfg = KVConfig(block_size=1, gpu_capacity_blocks=gpu, host_capacity_blocks=0, policy=policy)
    return KVManager(cfg, clock, baseline)


def serve(mgr, clock, keys, workflow, agent, fixed=0):
    clock.advance()
    adm = mgr.try_admit(AdmitRequest(list(keys), len(keys), 0, workflow, agent, "", fixed))
    mgr.commit(adm, list(keys))
    mgr.release(adm)
    mgr.check_integrity()


def test_step_graph_distances():
    g = StepGraph(EDGES)
    assert g.distance("coder", "coder") == 0
    assert g.distance("coder", "tester") == 1
    assert g.distance("coder", "analyzer") == 2
    assert g.distance("tester", "coder") == 2
    assert g.distance("coder", "planner") == UNREACHABLE


def test_kvflow_dynamic_first_then_descending_steps_to_execution(clock):
    mgr = manager(clock, "kvflow", BaselineInputs(step_graph_edges=EDGES))
    mgr.on_workflow_started("w")
    # preamble [1,2]; role prompts 10/20/30 are fixed prefixes; 99 is a dynamic suffix
    serve(mgr, clock, [1, 2, 20, 99], "w", "coder", fixed=3)
    serve(mgr, clock, [1, 2, 10], "w", "planner", fixed=3)
    serve(mgr, clock, [1, 2, 30], "w", "tester", fixed=3)
    mgr.on_agent_invoked("w", "coder", step=1)
    assert mgr.kvflow.steps_to_execution("tester") == 1
    # dynamic 99 (LRU) first; then planner (unreachable), tester (1), coder (0), preamble
    assert eviction_order(mgr, 5) == [99, 10, 30, 20, 1]


def test_kvflow_order_follows_the_workflow(clock):
    mgr = manager(clock, "kvflow", BaselineInputs(step_graph_edges=EDGES))
    serve(mgr, clock, [1, 2, 20], "w", "coder", fixed=3)
    serve(mgr, clock, [1, 2, 30], "w", "tester", fixed=3)
    mgr.on_agent_invoked("w", "tester", step=2)  # now coder is 2 steps away, tester 0
    assert eviction_order(mgr, 2) == [20, 30]
    with pytest.raises(ValueError, match="step graph"):
        manager(clock, "kvflow", None)


def test_belady_evicts_farthest_next_use(clock):
    # w1's steps start at 0, 10 and 20 s into it; w2 (pending) lasts 40 s
    future = {
        "w1": [
            FutureStep([1, 2, 3], 0.0),
            FutureStep([1, 2, 9], 10.0),
            FutureStep([1, 2, 5], 20.0),
        ],
        "w2": [FutureStep([1, 2, 4], 0.0), FutureStep([1, 2, 7], 40.0)],
    }
    mgr = manager(clock, "belady-est", BaselineInputs(future=future, concurrency=1))
    for keys in ([1, 2, 3], [1, 2, 5], [1, 2, 7]):
        serve(mgr, clock, keys, None, "")
    mgr.on_agent_invoked("w1", "coder", step=0)
    mgr.on_agent_invoked("w1", "tester", step=1)  # [3] is never used again
    clock.advance(4.0)
    mgr.belady.refresh()
    assert mgr.tree.match_prefix([1, 2, 5]).node.hint == 6.0  # 20 - 10 - 4 s in
    # w2 is next in line: it starts after one mean workflow (30 s), then 40 s to [7]
    assert mgr.tree.match_prefix([1, 2, 7]).node.hint == 70.0
    assert eviction_order(mgr, 3) == [3, 7, 5]
    with pytest.raises(ValueError, match="whole workload"):
        manager(clock, "belady-est", None)
