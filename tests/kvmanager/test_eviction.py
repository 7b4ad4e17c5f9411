"""Exact eviction orders of lru, lae, he and pbkv on hand-built trees (§5.2–§5.3)."""

import numpy as np
import pytest

from pbkv.kvmanager import AdmitRequest

from .conftest import make_manager

AGENTS = ("planner", "coder", "tester")


def run(mgr, clock, keys, workflow=None, agent=""):
    """Admit, prefill-commit and release one request whose prompt is ``keys``."""
    clock.advance()
    adm = mgr.try_admit(AdmitRequest(list(keys), len(keys), 0, workflow, agent))
    assert adm is not None
    for load in adm.loads:
        mgr.complete_load(load, ok=True)
    mgr.commit(adm, list(keys))
    mgr.release(adm)
    mgr.check_integrity()


def forecast(**probs):
    """One-step forecast row (K=1) putting ``probs`` on agents, the rest on END."""
    row = np.array([probs.get(a, 0.0) for a in AGENTS] + [0.0])
    row[-1] = 1.0 - row.sum()
    return row[None, :]


def eviction_order(mgr, n):
    """Evict leaves one block at a time and return the first key of each victim."""
    order = []
    for _ in range(n):
        before = {id(x): x.keys[0] for x in mgr.tree.nodes() if x.on_gpu}
        mgr.tree.evict("gpu", 1)
        after = {id(x) for x in mgr.tree.nodes() if x.on_gpu}
        order += [k for i, k in before.items() if i not in after]
        mgr.check_integrity()
    return order


def test_lru_evicts_least_recent_leaf_first(clock):
    mgr = make_manager(clock, "lru", host=0)
    for k in (10, 20, 30):
        run(mgr, clock, [k])
    run(mgr, clock, [10])
    assert eviction_order(mgr, 3) == [20, 30, 10]


def test_lae_retired_before_active_then_lru(clock):
    mgr = make_manager(clock, "lae", host=0)
    mgr.on_workflow_started("w1")
    mgr.on_workflow_started("w2")
    run(mgr, clock, [10], "w1", "coder")
    run(mgr, clock, [20], "w2", "coder")
    run(mgr, clock, [30], "w1", "coder")
    mgr.on_workflow_terminated("w2")
    assert eviction_order(mgr, 3) == [20, 10, 30]


def test_retired_goes_before_active_even_with_higher_score(clock):
    mgr = make_manager(clock, "he", host=0)
    mgr.on_workflow_started("w1")
    mgr.on_workflow_started("w2")
    run(mgr, clock, [10], "w1", "coder")
    run(mgr, clock, [20], "w2", "coder")
    mgr.on_forecast("w1", forecast(coder=0.0), AGENTS)
    mgr.on_forecast("w2", forecast(coder=1.0), AGENTS)
    assert mgr.tree.match_prefix([20]).node.score > mgr.tree.match_prefix([10]).node.score
    mgr.on_workflow_terminated("w2")
    assert eviction_order(mgr, 2) == [20, 10]


def test_shared_node_outranks_single_workflow_node(clock):
    mgr = make_manager(clock, "he", host=0)
    for w in ("w1", "w2"):
        mgr.on_workflow_started(w)
        mgr.on_forecast(w, forecast(coder=0.5, tester=0.5), AGENTS)
    run(mgr, clock, [10], "w1", "coder")
    run(mgr, clock, [10], "w2", "coder")  # shared by two workflows
    run(mgr, clock, [20], "w1", "tester")  # used by one, more recent
    assert mgr.tree.match_prefix([10]).node.score == 1.0
    assert mgr.tree.match_prefix([20]).node.score == 0.5
    assert eviction_order(mgr, 2) == [20, 10]


def test_ascending_score_order_with_lru_tiebreak(clock):
    mgr = make_manager(clock, "he", host=0)
    mgr.on_workflow_started("w")
    mgr.on_forecast("w", forecast(planner=0.1, coder=0.6, tester=0.1), AGENTS)
    run(mgr, clock, [10], "w", "coder")
    run(mgr, clock, [20], "w", "planner")
    run(mgr, clock, [30], "w", "tester")
    # planner and tester tie at 0.1; the older (20) goes first; coder last.
    assert eviction_order(mgr, 3) == [20, 30, 10]


def test_falling_score_is_seen_by_the_index(clock):
    mgr = make_manager(clock, "he", host=0)
    mgr.on_workflow_started("w")
    mgr.on_forecast("w", forecast(coder=0.9, tester=0.05), AGENTS)
    run(mgr, clock, [10], "w", "coder")
    run(mgr, clock, [20], "w", "tester")
    # the forecast flips: coder's node must now go first although it was keyed high
    mgr.on_forecast("w", forecast(coder=0.05, tester=0.9), AGENTS)
    assert eviction_order(mgr, 2) == [10, 20]


def test_score_sums_over_horizon_with_decay_and_survival(clock):
    mgr = make_manager(clock, "he", host=0, gamma=0.5)
    mgr.on_workflow_started("w")
    run(mgr, clock, [10], "w", "coder")
    # step 1: coder .5, END .5; step 2: coder 1.0 -> Score = .5 + .5 * (1 - .5) * 1.0
    f = np.array([[0.0, 0.5, 0.0, 0.5], [0.0, 1.0, 0.0, 0.0]])
    assert mgr.on_forecast("w", f, AGENTS) == 1
    assert mgr.tree.match_prefix([10]).node.score == 0.75


def test_lru_ignores_forecasts(clock):
    mgr = make_manager(clock, "lru", host=0)
    run(mgr, clock, [10], "w", "coder")
    assert mgr.on_forecast("w", forecast(coder=1.0), AGENTS) == 0
    assert mgr.tree.match_prefix([10]).node.score == 0.0


def test_a_late_request_does_not_revive_a_terminated_workflow(clock):
    mgr = make_manager(clock, "lae", host=0)
    mgr.on_workflow_started("w")
    run(mgr, clock, [10], "w", "coder")
    mgr.on_workflow_terminated("w")
    run(mgr, clock, [10, 11], "w", "coder")  # arrives after termination
    assert "w" not in mgr.scores.active_workflows
    assert mgr.tree.match_prefix([10]).node.retired


def test_peek_min_shows_what_pop_min_takes_and_keeps_it():
    from pbkv.kvmanager.eviction import EvictionIndex
    from pbkv.kvmanager.node import Node

    nodes = [Node([i], None, "", serial=i) for i in range(4)]
    alive = {0, 2, 3}
    index = EvictionIndex(lambda n: (n.keys[0] % 2,), lambda n: n.serial in alive)
    for node in nodes:
        index.update(node)
    assert index.peek_min() is nodes[0] and index.peek_min() is nodes[0]
    alive.discard(0)
    assert index.peek_min() is nodes[2]  # node 0 is no longer a candidate
    assert index.pop_min() is nodes[2] and index.pop_min() is nodes[3]
    assert index.peek_min() is None  # node 1 (priority 1) is not a candidate either


def test_a_node_rescored_while_it_had_a_child_is_ranked_by_its_new_score(clock):
    """A refresh skips non-candidates (an inner node); when its child leaves, the node
    enters the eviction order with the score it has now, not the one it had before."""
    mgr = make_manager(clock, "he", host=0)
    for w in ("w1", "w2"):
        mgr.on_workflow_started(w)
    run(mgr, clock, [10, 11], "w1", "coder")  # 10 -> 11 after the split below
    run(mgr, clock, [10], "w1", "coder")
    run(mgr, clock, [20], "w2", "coder")
    mgr.on_forecast("w1", forecast(coder=1.0), AGENTS)  # [10] is an inner node now
    mgr.on_forecast("w2", forecast(coder=0.5), AGENTS)
    mgr.on_forecast("w1", forecast(coder=0.2), AGENTS)  # [10] drops below [20]
    mgr.tree.evict("gpu", 1)  # the leaf [11] (score 0.2 < 0.5) goes first
    assert mgr.tree.lowest_candidate("gpu").keys == [10]
    assert eviction_order(mgr, 2) == [10, 20]


def test_check_integrity_catches_a_node_outside_its_agent_group(clock):
    mgr = make_manager(clock, "he", host=0)
    mgr.on_workflow_started("w1")
    run(mgr, clock, [10], "w1", "coder")
    node = mgr.tree.match_prefix([10]).node
    node.accessors["w1"].add("tester")  # behind the score board's back
    with pytest.raises(AssertionError, match="group"):
        mgr.check_integrity()


def test_an_agent_whose_prompt_is_rewritten_above_its_tail_leaves_the_old_tail(clock):
    """A re-planner rewrites the top of its prompt each step: the old step's tail is dead
    for it, so it stops protecting it (retired: no active workflow holds it), while a
    prompt that extends the previous one keeps its whole branch (issue 28)."""
    mgr = make_manager(clock, "he", host=0)
    mgr.on_workflow_started("w")
    mgr.on_forecast("w", forecast(coder=0.9), AGENTS)
    run(mgr, clock, [1, 2, 3], "w", "coder")
    run(mgr, clock, [1, 2, 3, 4], "w", "coder")  # extends: nothing left
    assert not any(n.retired for n in mgr.tree.nodes())
    run(mgr, clock, [1, 9, 9], "w", "coder")  # rewritten after block 1
    by_key = {tuple(n.keys): n for n in mgr.tree.nodes()}
    assert by_key[(2, 3)].retired and by_key[(4,)].retired and by_key[(2, 3)].score == 0.0
    assert not by_key[(1,)].retired and by_key[(1,)].score == pytest.approx(0.9)
    assert not by_key[(9, 9)].retired
    assert eviction_order(mgr, 4) == [4, 2, 2, 9]  # the dead tail (4, then 3 and 2), then 9
