"""Admission schedulers: exact admission orders, bounded bypass, the cohort hold and the
queue-aware eviction they feed (§7.0)."""

from collections import deque
from dataclasses import dataclass

import pytest

from pbkv.engines.base import GenerateRequest
from pbkv.engines.scheduler import (
    FCFSScheduler,
    ForwardCosts,
    LPMScheduler,
    WorkflowScheduler,
    get_scheduler,
)
from pbkv.kvmanager import AdmitRequest, KVConfig, KVManager


@dataclass(eq=False)
class Entry:
    request: GenerateRequest
    keys: list[int]
    retractions: int = 0
    admission: object = None


def entry(name, keys, *, workflow="w", new_tokens=1, extra_tokens=0):
    prompt = tuple(range(len(keys) + extra_tokens))
    request = GenerateRequest(name, workflow, "a", prompt, new_tokens)
    return Entry(request, list(keys))


def manager(gpu=8, host=0, policy="lru"):
    config = KVConfig(
        block_size=1, gpu_capacity_blocks=gpu, host_capacity_blocks=host, policy=policy
    )
    return KVManager(config, lambda: 0.0)


def cache(kv, keys, workflow="w"):
    """Run one request over ``keys`` to completion so they stay cached (unleased)."""
    adm = kv.try_admit(AdmitRequest(keys=keys, prompt_tokens=len(keys), max_new_tokens=1))
    kv.commit(adm, keys)
    kv.release(adm)


def hold(kv, blocks):
    """Lease ``blocks`` GPU blocks with a running request (never released here)."""
    keys = list(range(1000, 1000 + blocks - 1))
    return kv.try_admit(AdmitRequest(keys=keys, prompt_tokens=len(keys), max_new_tokens=1))


def admit(scheduler, kv, waiting, slots=8, running=0, prefill_share=None, costs=None):
    admitted = []
    scheduler.admit(
        kv,
        waiting,
        slots,
        on_admit=lambda e, adm: admitted.append(e.request.request_id),
        on_reject=lambda e, err: admitted.append(f"rejected {e.request.request_id}"),
        running=running,
        prefill_share=prefill_share,
        costs=costs,
    )
    return admitted


def test_fcfs_blocks_behind_a_head_that_does_not_fit():
    kv = manager(gpu=8)
    hold(kv, 5)
    waiting = deque([entry("big", range(100, 105)), entry("small", [1])])  # 6 and 2 blocks
    assert admit(FCFSScheduler(), kv, waiting) == []
    assert [e.request.request_id for e in waiting] == ["big", "small"]


def test_lpm_admits_the_longest_cached_prefix_first():
    kv = manager(gpu=16)
    cache(kv, [1, 2, 3])
    waiting = deque([entry("cold", [9, 8, 7]), entry("warm", [1, 2, 3, 4]), entry("part", [1])])
    assert admit(LPMScheduler(), kv, waiting, slots=2) == ["warm", "part"]


def test_bypass_is_bounded():
    kv = manager(gpu=12)
    hold(kv, 5)
    big = entry("big", range(100, 107), new_tokens=2)  # 9 blocks: does not fit now
    scheduler = LPMScheduler(max_bypass=2)
    waiting = deque([big, entry("s1", [1]), entry("s2", [2])])
    assert admit(scheduler, kv, waiting) == ["s1", "s2"]  # big overtaken twice
    waiting.append(entry("s3", [3]))
    assert admit(scheduler, kv, waiting) == []  # big now goes first and blocks the rest
    with pytest.raises(ValueError, match="max_bypass"):
        LPMScheduler(max_bypass=-1)


def test_workflow_scheduler_admits_oldest_workflow_first_and_cached_requests_ahead():
    kv = manager(gpu=32)
    for w in ("w0", "w1", "w2"):
        kv.on_workflow_started(w)
    cache(kv, [5, 6, 7, 8])
    waiting = deque(
        [
            entry("w2-cold", [40, 41], workflow="w2"),
            entry("w1-cold", [30, 31], workflow="w1"),
            entry("w2-warm", [5, 6, 7, 8], workflow="w2"),
            entry("w0-cold", [20, 21], workflow="w0"),
        ]
    )
    scheduler = WorkflowScheduler(cohort_fill=None)
    assert admit(scheduler, kv, waiting) == ["w2-warm", "w0-cold", "w1-cold", "w2-cold"]


def cohort_setup(gpu: int = 16, new_tokens: int = 1):
    """w0 (older) has 10 active blocks cached on a ``gpu``-block GPU; on 16 blocks w1's
    6-token request (decoding ``new_tokens``) fits only by evicting them, w0's 3-token
    one fits beside them."""
    kv = manager(gpu=gpu, host=0)
    for w in ("w0", "w1"):
        kv.on_workflow_started(w)
    context = list(range(20, 30))
    adm = kv.try_admit(AdmitRequest(context, len(context), 1, "w0", "a"))
    kv.commit(adm, context)
    kv.release(adm)
    waiting = deque(
        [
            entry("w1", range(10, 16), workflow="w1", new_tokens=new_tokens),
            entry("w0", [1, 2, 3], workflow="w0"),
        ]
    )
    return kv, waiting


def test_cohort_holds_younger_workflows_while_recompute_keeps_the_gpu_busy():
    kv, waiting = cohort_setup()
    scheduler = WorkflowScheduler(cohort_fill=0.5)
    assert scheduler.cohort(kv, waiting) == {"w0"}
    assert admit(scheduler, kv, waiting, running=1, prefill_share=0.9) == ["w0"]  # w1 waits
    assert admit(scheduler, kv, waiting, running=1, prefill_share=0.4) == []  # hysteresis
    assert admit(scheduler, kv, waiting, running=0, prefill_share=0.4) == ["w1"]  # idle GPU
    with pytest.raises(ValueError, match="cohort_fill"):
        WorkflowScheduler(cohort_fill=0.0)
    with pytest.raises(ValueError, match="release_share"):
        WorkflowScheduler(engage_share=0.2, release_share=0.3)


def test_cohort_lets_go_while_decode_dominates_and_when_unmeasured_it_holds():
    kv, waiting = cohort_setup()
    scheduler = WorkflowScheduler(cohort_fill=0.5)
    assert admit(scheduler, kv, waiting, running=1, prefill_share=0.1) == ["w0", "w1"]
    kv, waiting = cohort_setup()
    assert admit(WorkflowScheduler(cohort_fill=0.5), kv, waiting, running=1) == ["w0"]


CPU_FORWARDS = ForwardCosts(forward_s=0.06, prefill_token_s=0.0025)
"""A forward costs 24 prefill tokens' compute (SmolLM2 on this project's CPU)."""


def test_a_hold_that_costs_more_forwards_than_it_saves_is_released():
    """One request runs: held, w1 saves at most its 6 + 4 tokens' recompute (25 ms), but
    its 4 decode tokens lose their share of the running forwards, 4 x 60 ms / (1 x 2)."""
    kv, waiting = cohort_setup(new_tokens=4)
    scheduler = WorkflowScheduler(cohort_fill=0.5)
    assert scheduler.cohort(kv, waiting) == {"w0"}
    running = admit(scheduler, kv, waiting, running=1, prefill_share=0.9, costs=CPU_FORWARDS)
    assert running == ["w0", "w1"]
    kv, waiting = cohort_setup(new_tokens=4)  # unknown costs: the hold stands
    assert admit(WorkflowScheduler(), kv, waiting, running=1, prefill_share=0.9) == ["w0"]


def test_a_hold_that_saves_more_than_it_costs_stays():
    # many requests running: one more row barely changes a decode token's share
    kv, waiting = cohort_setup(new_tokens=4)
    scheduler = WorkflowScheduler(cohort_fill=0.5)
    assert admit(scheduler, kv, waiting, running=8, prefill_share=0.9, costs=CPU_FORWARDS) == ["w0"]
    # forwards of 12 prefill tokens' compute, one request running: a 1-token decode
    # costs 30 ms / 2 = 15 ms against 7 tokens' 17.5 ms saved (held); 4 tokens, 60 ms
    # against 25 ms (let in)
    half = ForwardCosts(forward_s=0.03, prefill_token_s=0.0025)
    for new_tokens, admitted in ((1, ["w0"]), (4, ["w0", "w1"])):
        kv, waiting = cohort_setup(new_tokens=new_tokens)
        got = admit(WorkflowScheduler(), kv, waiting, running=1, prefill_share=0.9, costs=half)
        assert got == admitted, new_tokens
    # a GPU's forwards hide prefill: the hold pays with the same request and batch
    gpu = ForwardCosts(forward_s=0.05, prefill_token_s=0.0005)
    kv, waiting = cohort_setup(new_tokens=1)
    assert admit(WorkflowScheduler(), kv, waiting, running=4, prefill_share=0.9, costs=gpu) == [
        "w0"
    ]


def test_a_held_request_does_not_count_toward_queue_aware_eviction():
    # w1's prompt extends a cached prefix, but w1 waits behind the cohort: the prefix
    # gets no queued count until w1 is released (while held it is no near use)
    kv = manager(gpu=32, host=0, policy="pbkv")
    for w in ("w0", "w1"):
        kv.on_workflow_started(w)
    cache(kv, [40, 41, 42])
    waiting = deque(
        [
            entry("w1", [40, 41, 42, *range(50, 62)], workflow="w1"),
            entry("w0", range(1, 18), workflow="w0"),
        ]
    )
    scheduler = WorkflowScheduler(cohort_fill=0.3)
    assert scheduler.cohort(kv, waiting) == {"w0"}
    hold(kv, 15)  # running work fills the GPU, so w1 is only held, not admitted
    admit(scheduler, kv, waiting, slots=0, running=1, prefill_share=0.9)
    node = kv.tree.peek_path([40, 41, 42])[0]
    assert node.queued == 0 and kv.queued_cached_blocks(waiting[0].keys) == 3
    waiting.pop()  # w0's request ran and w0 ended: w1 joins the cohort
    kv.on_workflow_terminated("w0")
    admit(scheduler, kv, waiting, slots=0, running=1, prefill_share=0.9)
    assert node.queued == 1


def test_a_held_request_that_fits_in_free_space_is_admitted():
    kv = manager(gpu=16, host=0)
    for w in ("w0", "w1"):
        kv.on_workflow_started(w)
    waiting = deque(
        [entry("w1", range(10, 16), workflow="w1"), entry("w0", [1, 2, 3], workflow="w0")]
    )
    scheduler = WorkflowScheduler(cohort_fill=0.5)
    assert scheduler.cohort(kv, waiting) == {"w0"}  # w1 is outside the cohort, yet
    assert admit(scheduler, kv, waiting, running=1) == ["w0", "w1"]  # costs no cached block


def test_queued_prefixes_are_evicted_last_under_pbkv():
    kv = manager(gpu=8, policy="pbkv")
    kv.on_workflow_started("w")
    cache(kv, [1, 2])
    cache(kv, [3, 4])  # more recent than [1, 2]: LRU would evict [1, 2] first
    waiting = deque([entry("needs-12", [1, 2, 9])])
    FCFSScheduler().admit(
        kv, deque(), 0, on_admit=lambda *_: None, on_reject=lambda *_: None
    )  # an empty queue protects nothing
    kv.note_waiting([AdmitRequest(keys=[1, 2, 9], prompt_tokens=3, max_new_tokens=1)])
    assert kv.tree.peek_path([1, 2], "")[0].queued == 1
    kv.tree.evict("gpu", 2)
    assert kv.tree.peek_prefix([1, 2]) == (2, 0)
    assert kv.tree.peek_prefix([3, 4]) == (0, 0)
    assert len(waiting) == 1
    # lru ignores the queue
    plain = manager(gpu=8, policy="lru")
    assert plain.note_waiting([AdmitRequest(keys=[1], prompt_tokens=1, max_new_tokens=1)]) == 0


def test_unknown_scheduler_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: fcfs, lpm, workflow"):
        get_scheduler("sjf")


def started(kv, *workflows):
    for w in workflows:
        kv.on_workflow_started(w)  # start order is age: the first is the oldest


def run(kv, name, keys, *, workflow, new_tokens=2):
    """A running request: admitted, holding its reservation."""
    e = entry(name, keys, workflow=workflow, new_tokens=new_tokens)
    e.admission = kv.try_admit(
        AdmitRequest(
            keys=list(keys),
            prompt_tokens=len(keys),
            max_new_tokens=new_tokens,
            workflow_id=workflow,
        )
    )
    assert e.admission is not None
    return e


def admit_retracting(scheduler, kv, waiting, running, slots=8):
    """Admit with ``running`` retractable; a retraction releases and requeues (as engines do)."""
    admitted, retracted = [], []

    def retract(victim):
        kv.release(victim.admission)
        victim.retractions += 1
        retracted.append(victim.request.request_id)
        waiting.append(victim)

    scheduler.admit(
        kv,
        waiting,
        slots,
        on_admit=lambda e, adm: admitted.append(e.request.request_id),
        on_reject=lambda e, err: admitted.append(f"rejected {e.request.request_id}"),
        running=len(running),
        retractable=running,
        on_retract=retract,
    )
    return admitted, retracted


def test_workflow_scheduler_retracts_the_youngest_workflow_just_enough():
    kv = manager(gpu=12)
    started(kv, "w0", "w1", "w2")
    running = [
        run(kv, "w1-run", [10, 11], workflow="w1"),
        run(kv, "w2-run", [20, 21], workflow="w2"),
    ]
    waiting = deque([entry("w0-next", [1, 2, 3, 4, 5], workflow="w0")])  # 6 blocks, 4 free
    scheduler = WorkflowScheduler(cohort_fill=None, preempt=True)
    assert admit_retracting(scheduler, kv, waiting, running) == (["w0-next"], ["w2-run"])
    assert [e.request.request_id for e in waiting] == ["w2-run"]  # queued again


def test_no_retraction_that_would_not_make_the_request_fit():
    kv = manager(gpu=12)
    started(kv, "w0", "w1", "w2")
    running = [
        run(kv, "w0-run", [10, 11], workflow="w0"),
        run(kv, "w2-run", [20, 21], workflow="w2"),
    ]
    waiting = deque([entry("w1-big", range(30, 39), workflow="w1")])  # 10 blocks: w2 frees 4
    scheduler = WorkflowScheduler(cohort_fill=None, preempt=True)
    assert admit_retracting(scheduler, kv, waiting, running) == ([], [])  # w0 is older: kept


def test_retraction_is_bounded_and_optional():
    def setup():
        kv = manager(gpu=12)
        started(kv, "w0", "w1")
        running = [run(kv, "w1-run", [10, 11, 12, 13, 14], workflow="w1")]  # 7 blocks
        return kv, running, deque([entry("w0-next", [1, 2, 3, 4, 5], workflow="w0")])

    kv, running, waiting = setup()
    running[0].retractions = 2
    assert admit_retracting(
        WorkflowScheduler(cohort_fill=None, preempt=True), kv, waiting, running
    ) == ([], [])
    kv, running, waiting = setup()
    off = WorkflowScheduler(cohort_fill=None, preempt=False)
    assert admit_retracting(off, kv, waiting, running) == ([], [])
    kv, running, waiting = setup()
    assert admit_retracting(FCFSScheduler(), kv, waiting, running) == ([], [])
    kv, running, waiting = setup()
    on = WorkflowScheduler(cohort_fill=None, preempt=True, max_retractions=3)
    assert admit_retracting(on, kv, waiting, running) == (["w0-next"], ["w1-run"])
    with pytest.raises(ValueError, match="max_retractions"):
        WorkflowScheduler(max_retractions=-1)


def test_a_full_batch_retracts_one_younger_request_for_the_oldest():
    kv = manager(gpu=32)
    started(kv, "w0", "w1", "w2")
    running = [run(kv, "w1-run", [10], workflow="w1"), run(kv, "w2-run", [20], workflow="w2")]
    waiting = deque([entry("w0-next", [1], workflow="w0"), entry("w2-next", [21], workflow="w2")])
    scheduler = WorkflowScheduler(cohort_fill=None, preempt=True)
    assert admit_retracting(scheduler, kv, waiting, running, slots=0) == (["w0-next"], ["w2-run"])


def test_workflow_retract_is_the_workflow_scheduler_with_retraction_on():
    on, off = get_scheduler("workflow-retract"), get_scheduler("workflow")
    assert (on.name, on.preempt, off.name, off.preempt) == (
        "workflow-retract",
        True,
        "workflow",
        False,
    )


def test_a_held_request_is_admitted_in_the_call_after_room_frees():
    # on 17 blocks w1 (held back, outside the cohort) fits in free space only once w0's
    # running request ends
    kv, waiting = cohort_setup(gpu=17)
    scheduler = WorkflowScheduler(cohort_fill=0.5)
    started = {}

    def admit_once():
        admitted = []
        scheduler.admit(
            kv,
            waiting,
            8,
            on_admit=lambda e, adm: (
                admitted.append(e.request.request_id),
                started.update({e: adm}),
            ),
            on_reject=lambda e, err: admitted.append(f"rejected {e.request.request_id}"),
            running=1,
        )
        return admitted

    assert scheduler.cohort(kv, waiting) == {"w0"}
    assert admit_once() == ["w0"]  # w1 held: 7 blocks, 3 free, the lowest block active
    refused = kv.statistics().rejected_admissions
    for _ in range(3):  # nothing changes: refused again, each try counted
        assert admit_once() == []
    assert kv.statistics().rejected_admissions == refused + 3
    (w0,) = started.values()
    kv.release(w0)  # w0's request ends: its 4 reserved blocks come back, 7 free
    assert admit_once() == ["w1"]  # fits in free space: admitted in this very call
    kv.check_integrity()
