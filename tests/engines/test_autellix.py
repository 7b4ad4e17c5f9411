"""Autellix's admission (arXiv 2502.13965 §4.2): PLAS, ATLAS on fan-out, the
discretised queues, anti-starvation and preemption of lower-priority calls."""

from collections import deque

import pytest

from pbkv.engines.autellix import AutellixScheduler
from pbkv.engines.scheduler import get_scheduler
from pbkv.kvmanager import KVConfig, KVManager

from .test_scheduler import admit, admit_retracting, entry


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def setup(gpu=64):
    clock = Clock()
    config = KVConfig(block_size=1, gpu_capacity_blocks=gpu, host_capacity_blocks=0)
    return KVManager(config, clock), clock


def serve(scheduler, kv, clock, calls):
    """Admit ``calls`` (name, workflow, key) now and end each at its end time, the
    scheduler called at each end, as an engine calls it on every step."""
    by_name = {}

    def started(e, adm):
        e.admission = adm
        by_name[e.request.request_id] = e

    waiting = deque(entry(name, [key], workflow=w) for name, w, key, _ in calls)
    scheduler.admit(kv, waiting, 64, on_admit=started, on_reject=None)
    for name, _, _, end_s in sorted(calls, key=lambda c: c[3]):
        clock.t = end_s
        e = by_name[name]
        kv.commit(e.admission, e.keys)
        kv.release(e.admission)
        scheduler.admit(kv, deque(), 64, on_admit=started, on_reject=None)


def ids(waiting):
    return [e.request.request_id for e in waiting]


def test_plas_admits_the_program_with_least_attained_service_first():
    kv, clock = setup()
    scheduler = AutellixScheduler(mode="plas", base_quantum_s=1.0, quantum_ratio=2.0)
    serve(scheduler, kv, clock, [("a0", "w0", 1, 5.0), ("a1", "w1", 2, 0.5), ("a2", "w2", 3, 2.5)])
    attained = [scheduler.attained_s(w) for w in ("w0", "w1", "w2")]
    assert attained == [5.0, 0.5, 2.5]
    assert [scheduler.level(s) for s in attained] == [3, 0, 2]  # [4,8) [0,1) [2,4)
    waiting = deque(
        [
            entry("w0-next", [10], workflow="w0"),
            entry("w2-next", [30], workflow="w2"),
            entry("w1-next", [20], workflow="w1"),
            entry("new", [40], workflow="w3"),
        ]
    )
    assert admit(scheduler, kv, waiting) == ["w1-next", "new", "w2-next", "w0-next"]


def fan_out(scheduler, kv, clock):
    """F: a 1 s call, then three 1 s calls at once; S: one 3 s call."""
    serve(scheduler, kv, clock, [("f-plan", "F", 1, 1.0), ("s-call", "S", 9, 3.0)])
    clock.t = 3.0
    serve(
        scheduler,
        kv,
        clock,
        [("f-b1", "F", 2, 4.0), ("f-b2", "F", 3, 4.0), ("f-b3", "F", 4, 4.0)],
    )


def test_atlas_ranks_a_fan_out_by_its_critical_path_plas_by_its_sum():
    queue = [entry("S-next", [19], workflow="S"), entry("F-join", [11], workflow="F")]
    # ratio 1.5: [1.5, 2.25) is level 2, [2.25, 3.375) level 3, [3.375, 5.06) level 4
    kv, clock = setup()
    atlas = AutellixScheduler(mode="atlas", base_quantum_s=1.0, quantum_ratio=1.5)
    fan_out(atlas, kv, clock)
    assert (atlas.attained_s("F"), atlas.attained_s("S")) == (2.0, 3.0)
    assert ids(atlas.rank(kv, deque(queue))) == ["F-join", "S-next"]
    kv, clock = setup()
    plas = AutellixScheduler(mode="plas", base_quantum_s=1.0, quantum_ratio=1.5)
    fan_out(plas, kv, clock)
    assert (plas.attained_s("F"), plas.attained_s("S")) == (4.0, 3.0)
    assert ids(plas.rank(kv, deque(queue))) == ["S-next", "F-join"]


def test_a_program_that_waited_beta_times_its_service_is_promoted_to_level_0():
    kv, clock = setup()
    scheduler = AutellixScheduler(base_quantum_s=1.0, starvation_ratio=3.0)
    serve(scheduler, kv, clock, [("a0", "w0", 1, 4.0)])  # 4 s of service: level 3
    waiting = deque([entry("w0-next", [10], workflow="w0"), entry("w1-first", [20], workflow="w1")])
    admit(scheduler, kv, waiting, slots=0)  # both queued at 4 s
    clock.t = 4.0 + 11.9
    assert ids(scheduler.rank(kv, waiting)) == ["w1-first", "w0-next"]
    clock.t = 4.0 + 12.0  # waited 12 s = 3 x 4 s
    assert ids(scheduler.rank(kv, waiting)) == ["w0-next", "w1-first"]


def start_running(scheduler, kv, name, keys, workflow):
    """Admit one call through ``scheduler`` and return it as a running request."""
    running = []

    def started(e, adm):
        e.admission = adm
        running.append(e)

    waiting = deque([entry(name, keys, workflow=workflow)])
    scheduler.admit(kv, waiting, 8, on_admit=started, on_reject=None)
    return running


def test_a_lower_priority_call_is_retracted_for_the_one_that_goes_next():
    kv, clock = setup(gpu=12)
    scheduler = AutellixScheduler(base_quantum_s=1.0)
    serve(scheduler, kv, clock, [("a0", "w0", 1, 8.0)])  # w0: 8 s of service, level 4
    running = start_running(scheduler, kv, "w0-run", [10, 11, 12, 13, 14], "w0")  # 6 blocks
    waiting = deque([entry("w1-new", range(20, 27), workflow="w1")])  # 8 blocks, 6 to be had
    assert admit_retracting(scheduler, kv, waiting, running) == (["w1-new"], ["w0-run"])


@pytest.mark.parametrize("served_s, preempt", [(0.0, True), (8.0, False)])
def test_no_retraction_at_the_same_level_or_with_preemption_off(served_s, preempt):
    kv, clock = setup(gpu=12)
    scheduler = AutellixScheduler(base_quantum_s=1.0, preempt=preempt)
    if served_s:
        serve(scheduler, kv, clock, [("a0", "w0", 1, served_s)])
    running = start_running(scheduler, kv, "w0-run", [10, 11, 12, 13, 14], "w0")
    waiting = deque([entry("w1-new", range(20, 27), workflow="w1")])
    assert admit_retracting(scheduler, kv, waiting, running) == ([], [])


def test_autellix_is_registered_and_checks_its_arguments():
    scheduler = get_scheduler("autellix")
    assert (scheduler.name, scheduler.preempt, scheduler.mode) == ("autellix", True, "atlas")
    with pytest.raises(ValueError, match="quantum_ratio"):
        AutellixScheduler(quantum_ratio=1.0)
    with pytest.raises(ValueError, match="starvation_ratio"):
        AutellixScheduler(starvation_ratio=0.0)
    with pytest.raises(ValueError, match="mode"):
        AutellixScheduler(mode="las")  # type: ignore[arg-type]
