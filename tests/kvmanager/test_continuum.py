"""Continuum's TTL pins (arXiv 2511.02230): the TTL rule of Eq. 2, a pinned node held until
its TTL expires or its program's next request is admitted, and the idle guard."""

import math

import pytest

from pbkv.kvmanager import AdmitRequest, ContinuumTracker
from pbkv.kvmanager.continuum import empirical_ttl_s, memoryfulness, prior_ttl_s

from .conftest import make_manager

RELOAD_S_PER_BLOCK = 10.0  # bytes_per_block 100 over a 10 B/s link: R = 10 s a block


def continuum(clock, gpu=10):
    return make_manager(
        clock, policy="continuum", gpu=gpu, host=0, bytes_per_block=100, bandwidth_bytes_per_s=10.0
    )


def call(kv, workflow, agent, keys, step=0, new_tokens=1):
    """Invoke ``agent`` of ``workflow`` and admit its request over ``keys``."""
    kv.on_agent_invoked(workflow, agent, step)
    return kv.try_admit(AdmitRequest(list(keys), len(keys), new_tokens, workflow, agent))


def finish(kv, adm):
    kv.commit(adm, adm.request.keys)
    kv.release(adm)


def gpu_blocks(kv, keys):
    return kv.tree.peek_prefix(list(keys))[0]


def test_ttl_maximises_eq2_over_the_empirical_distribution():
    # F(tau) * 8 - tau at 0, 0.5, 1, 2, 10: 0, 1.5, 3, 4, -2
    assert empirical_ttl_s([0.5, 1.0, 2.0, 10.0], 8.0) == 2.0
    assert empirical_ttl_s([3.0, 3.0], 2.0) == 0.0  # pinning never pays
    assert prior_ttl_s(math.exp(2.0)) == pytest.approx(2.0)  # Exp(1 s): tau = ln B
    assert prior_ttl_s(0.9) == 0.0


def test_memoryfulness_is_minus_the_correlation_of_turns_done_and_left():
    assert memoryfulness([4, 4, 4]) == 1.0  # one length: turns left follow exactly
    # boundaries of a 2-turn and a 6-turn program: (1,1) (1,5) (2,4) (3,3) (4,2) (5,1)
    assert memoryfulness([2, 6]) == pytest.approx(0.5)
    assert memoryfulness([]) == 1.0  # undefined: the paper's cold value


def test_ttl_reads_the_prior_then_the_tools_own_distribution_then_everyones(clock):
    kv = continuum(clock)
    tracker = ContinuumTracker(kv.tree, reload_s_per_block=1.0, shortfall=lambda request: 0)
    assert tracker.ttl_s("search", 10) == pytest.approx(math.log(10.0))  # cold start, B = 10
    for _ in range(101):
        tracker.observe_duration("search", 2.0)
        tracker.observe_duration("build", 30.0)
    assert tracker.ttl_s("search", 10) == 2.0  # its own: F(2) = 1, 10 - 2 > 0
    assert tracker.ttl_s("build", 10) == 0.0  # its own: 30 s never pays for B = 10
    assert tracker.ttl_s("lint", 10) == 2.0  # unseen: everyone's, F(2) = 1/2: 5 - 2 = 3


def test_a_pinned_node_is_not_evicted_before_its_ttl_and_is_after_it(clock):
    kv = continuum(clock, gpu=10)
    for w in ("w0", "w1", "w2"):
        kv.on_workflow_started(w)
    finish(kv, call(kv, "w0", "coder", [1, 2, 3]))  # pinned: R = 30 s, TTL = ln 30
    ttl_s = math.log(3 * RELOAD_S_PER_BLOCK)
    assert kv.continuum.pinned("w0")
    running = call(kv, "w2", "tester", [50])  # holds 2 blocks: the GPU is not idle
    assert running is not None
    clock.advance(ttl_s - 0.01)
    assert call(kv, "w1", "planner", [20, 21, 22, 23, 24]) is None  # 6 blocks, 5 free
    assert gpu_blocks(kv, [1, 2, 3]) == 3
    clock.advance(0.02)  # past the TTL
    assert call(kv, "w1", "planner", [20, 21, 22, 23, 24], step=1) is not None
    assert gpu_blocks(kv, [1, 2, 3]) == 2  # its tail block was evicted
    assert kv.continuum.statistics().expired == 1
    kv.check_integrity()


def test_lru_would_evict_the_same_node_at_once(clock):
    kv = make_manager(clock, policy="lru", gpu=10, host=0)
    for w in ("w0", "w1", "w2"):
        kv.on_workflow_started(w)
    finish(kv, call(kv, "w0", "coder", [1, 2, 3]))
    assert call(kv, "w2", "tester", [50]) is not None
    assert call(kv, "w1", "planner", [20, 21, 22, 23, 24]) is not None
    assert gpu_blocks(kv, [1, 2, 3]) == 2


def test_the_programs_next_request_takes_over_its_pin(clock):
    kv = continuum(clock, gpu=10)
    kv.on_workflow_started("w0")
    finish(kv, call(kv, "w0", "coder", [1, 2, 3]))
    clock.advance(1.5)  # the tool runs 1.5 s
    nxt = call(kv, "w0", "tester", [1, 2, 3, 4], step=1)
    assert nxt is not None and nxt.cached_gpu_tokens == 3
    assert not kv.continuum.pinned("w0")
    stats = kv.continuum.statistics()
    assert (stats.released_by_next_request, stats.tool_samples) == (1, 1)
    assert stats.queue_delay_s == 0.0  # retained: no queue delay is recorded
    kv.check_integrity()


def test_an_expired_pin_is_held_while_its_programs_next_request_waits(clock):
    kv = continuum(clock, gpu=10)
    kv.on_workflow_started("w0")
    finish(kv, call(kv, "w0", "coder", [1, 2, 3]))
    kv.on_agent_invoked("w0", "tester", 1)  # its next request arrives, not yet admitted
    clock.advance(10.0)  # well past ln 30 s
    assert kv.continuum.expire() == 0
    assert kv.continuum.pinned("w0")
    kv.try_admit(AdmitRequest([1, 2, 3, 4], 4, 1, "w0", "tester"))
    assert not kv.continuum.pinned("w0")


def test_pins_end_with_their_program_and_a_finished_program_is_never_pinned(clock):
    kv = continuum(clock, gpu=10)
    kv.on_workflow_started("w0")
    adm = call(kv, "w0", "coder", [1, 2, 3])
    finish(kv, adm)
    kv.on_workflow_terminated("w0")
    assert not kv.continuum.pinned("w0")
    late = kv.try_admit(AdmitRequest([1, 2, 3, 4], 4, 1, "w0", "coder"))
    finish(kv, late)
    assert kv.continuum.statistics().pinned_now == 0
    assert kv.tree.lease_count() == 0


def test_with_nothing_running_pins_give_way_earliest_deadline_first_just_enough(clock):
    kv = continuum(clock, gpu=10)
    for w in ("w0", "w1", "w2"):
        kv.on_workflow_started(w)
    finish(kv, call(kv, "w1", "coder", [5, 6, 7, 8]))  # deadline ln 40 s
    finish(kv, call(kv, "w0", "coder", [1, 2, 3]))  # deadline ln 30 s: the earliest
    # 3 free blocks, w2 needs 6 and nothing runs: w0's pin alone makes room
    assert call(kv, "w2", "planner", [20, 21, 22, 23, 24]) is not None
    assert kv.continuum.statistics().released_idle == 1
    assert (kv.continuum.pinned("w0"), kv.continuum.pinned("w1")) == (False, True)
    assert gpu_blocks(kv, [5, 6, 7, 8]) == 4
