"""Continuum's admission (arXiv 2511.02230 §4.3): program-level FCFS, pinned programs
first, head-of-line blocking."""

from collections import deque

import pytest

from pbkv.bench.compare import BenchConfig, compare_policies
from pbkv.engines.continuum import ContinuumScheduler
from pbkv.engines.scheduler import get_scheduler
from pbkv.kvmanager import AdmitRequest, KVConfig, KVManager

from .test_scheduler import admit, entry, hold, manager, started


def ids(waiting):
    return [e.request.request_id for e in waiting]


def test_an_older_programs_later_turn_goes_before_newer_programs():
    kv = manager(gpu=32)
    started(kv, "w0", "w1", "w2")  # w0 arrived first
    waiting = deque(
        [
            entry("w2-turn1", [30], workflow="w2"),
            entry("w1-turn1", [20], workflow="w1"),
            entry("w0-turn3", [10], workflow="w0"),
            entry("w1-turn1b", [21], workflow="w1"),
        ]
    )
    assert admit(ContinuumScheduler(), kv, waiting) == [
        "w0-turn3",
        "w1-turn1",
        "w1-turn1b",
        "w2-turn1",
    ]


def test_a_pinned_programs_request_goes_first():
    config = KVConfig(
        block_size=1,
        gpu_capacity_blocks=32,
        host_capacity_blocks=0,
        bytes_per_block=100,
        bandwidth_bytes_per_s=10.0,  # reload 10 s a block: a 3-block context is pinned
        policy="continuum",
    )
    kv = KVManager(config, lambda: 0.0)
    started(kv, "w0", "w1", "w2")
    kv.on_agent_invoked("w2", "coder", 0)
    adm = kv.try_admit(AdmitRequest([7, 8, 9], 3, 1, "w2", "coder"))
    kv.commit(adm, [7, 8, 9])
    kv.release(adm)
    assert kv.continuum.pinned("w2")
    waiting = deque(
        [entry("w1-next", [20], workflow="w1"), entry("w2-next", [7, 8, 9, 10], workflow="w2")]
    )
    assert ids(ContinuumScheduler().rank(kv, waiting)) == ["w2-next", "w1-next"]


def test_admission_stops_at_the_first_request_that_does_not_fit():
    kv = manager(gpu=8)
    started(kv, "w0", "w1")
    hold(kv, 5)  # 3 blocks free
    waiting = deque(
        [entry("w1-small", [20], workflow="w1"), entry("w0-big", range(10, 14), workflow="w0")]
    )
    assert admit(ContinuumScheduler(), kv, waiting) == []  # w0 goes first and waits
    assert ids(waiting) == ["w1-small", "w0-big"]


def test_continuum_is_a_registered_scheduler_with_balanced_batches():
    scheduler = get_scheduler("continuum")
    assert (scheduler.name, scheduler.balanced_prefill) == ("continuum", True)


@pytest.mark.parametrize("spec", ["continuum:continuum", "lru:autellix", "markov-survival"])
def test_each_baseline_serves_a_workload_to_its_end_with_integrity_checked(spec):
    config = BenchConfig(
        app="codegen", policies=(spec,), workflows=8, concurrency=4, check_integrity=True
    )
    (result,), _ = compare_policies(config)
    assert (result.workflows, result.scheduler) == (8, spec.partition(":")[2] or "fcfs")
    assert result.kv.requests > 8 and result.kv.evicted_active_blocks > 0
