"""The markov-survival baseline (CacheSage / CacheScout style): the online chain's
absorption probabilities, the survival eviction order and the next-agent warm-up."""

import pytest

from pbkv.kvmanager import AdmitRequest, MarkovChain
from pbkv.kvmanager.survival import END

from .conftest import make_manager


def test_reach_is_the_probability_of_invoking_a_target_before_end():
    chain = MarkovChain(smoothing=1.0)
    for _ in range(3):
        chain.observe("a", "b")
    chain.observe("a", END)
    # a: a 1/7, b 4/7, END 2/7 (counts + 1); b: unseen rows, uniform 1/3
    assert chain.row("a").tolist() == pytest.approx([1 / 7, 4 / 7, 2 / 7])
    # h(a) = 4/7 + 1/7 h(a) = 2/3; from a: 1/7 * 2/3 + 4/7 * 1 = 2/3
    assert chain.reach("a", frozenset({"b"})) == pytest.approx(2 / 3)
    # from b: 1/3 * h(a) + 1/3 * 1 = 5/9
    assert chain.reach("b", frozenset({"b"})) == pytest.approx(5 / 9)
    assert chain.most_likely_next("a") == ("b", pytest.approx(4 / 7))
    with pytest.raises(ValueError, match="smoothing"):
        MarkovChain(smoothing=0.0)


def run(kv, workflow, agent, keys, step):
    """Invoke ``agent`` of ``workflow`` and run its request over ``keys`` to the end."""
    kv.on_agent_invoked(workflow, agent, step)
    adm = kv.try_admit(AdmitRequest(list(keys), len(keys), 1, workflow, agent))
    kv.commit(adm, list(keys))
    kv.release(adm)


def teach(kv):
    """Workflows where ``closer`` always ends the workflow and ``looper`` calls itself
    four times in five."""
    for i in range(4):
        w = f"closer-{i}"
        kv.on_workflow_started(w)
        kv.on_agent_invoked(w, "closer", 0)
        kv.on_workflow_terminated(w)
    kv.on_workflow_started("looper-0")
    for step in range(5):
        kv.on_agent_invoked("looper-0", "looper", step)
    kv.on_workflow_terminated("looper-0")


def on_gpu(kv, keys):
    return kv.tree.peek_prefix(list(keys))[0]


def test_the_node_whose_holder_is_most_likely_to_end_is_evicted_first(clock):
    kv = make_manager(clock, policy="markov-survival", gpu=12, host=0)
    teach(kv)
    for w in ("done", "wa", "wb", "wc"):
        kv.on_workflow_started(w)
    run(kv, "done", "looper", [1, 2], 0)
    kv.on_workflow_terminated("done")  # retired: held by no active workflow
    clock.advance()
    run(kv, "wb", "looper", [20, 21], 0)  # wb loops: likely to call looper again
    clock.advance()
    run(kv, "wa", "closer", [10, 11], 0)  # wa's closer ends it: least likely reused
    chain, survival = kv.survival.chain, kv.survival
    assert survival.value(kv.tree.peek_path([10, 11])[0]) == pytest.approx(
        chain.reach("closer", frozenset({"closer"}))
    )
    # LRU would take [20, 21] (older) before [10, 11]; survival takes the retired node,
    # then wa's, then wb's
    kv.on_agent_invoked("wc", "planner", 0)
    big = kv.try_admit(AdmitRequest(list(range(30, 39)), 9, 1, "wc", "planner"))  # 10 blocks
    assert big is not None
    assert (on_gpu(kv, [1, 2]), on_gpu(kv, [10, 11]), on_gpu(kv, [20, 21])) == (0, 0, 2)
    kv.release(big)
    kv.check_integrity()


def test_lru_evicts_the_older_node_on_the_same_calls(clock):
    kv = make_manager(clock, policy="lru", gpu=12, host=0)
    teach(kv)
    for w in ("done", "wa", "wb", "wc"):
        kv.on_workflow_started(w)
    run(kv, "done", "looper", [1, 2], 0)
    kv.on_workflow_terminated("done")
    clock.advance()
    run(kv, "wb", "looper", [20, 21], 0)
    clock.advance()
    run(kv, "wa", "closer", [10, 11], 0)
    assert kv.try_admit(AdmitRequest(list(range(30, 39)), 9, 1, "wc", "planner")) is not None
    assert (on_gpu(kv, [1, 2]), on_gpu(kv, [10, 11]), on_gpu(kv, [20, 21])) == (0, 2, 0)


def test_warm_up_prefetches_the_most_likely_next_agents_prefix(clock):
    kv = make_manager(
        clock,
        policy="markov-survival",
        gpu=16,
        host=32,
        bytes_per_block=100,
        bandwidth_bytes_per_s=1000.0,
    )
    kv.on_workflow_started("w")
    run(kv, "w", "planner", [1, 2], 0)  # the planner's prefix
    run(kv, "w", "coder", [5, 6], 1)  # the coder's
    for _ in range(3):  # planner -> coder is the likely transition
        kv.survival.chain.observe("planner", "coder")
    kv.on_agent_invoked("w", "planner", 2)  # w runs the planner: the coder comes next
    kv.tree.evict("gpu", 4)  # both prefixes demoted to the host
    assert (on_gpu(kv, [1, 2]), on_gpu(kv, [5, 6])) == (0, 0)
    loads = kv.plan_prefetch(step_s=0.2)  # 1000 B/s * 0.2 s = 2 blocks of 100 B
    assert [[n.keys for n in load.nodes] for load in loads] == [[[5, 6]]]
    assert kv.survival.next_step_value(kv.tree.peek_path([1, 2])[0]) == 0.0
