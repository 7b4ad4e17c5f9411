"""Placement policies: exact decisions on small clusters (integrations/dynamo/placement.py)."""

import pytest

from pbkv.integrations.dynamo import (
    InFlight,
    KvAffinityPlacement,
    KvPlacement,
    PbkvPlacement,
    PbkvPlacementConfig,
    PlacementRequest,
    ReplicaView,
    RoundRobinPlacement,
    kv_cost,
    make_placement,
)


def req(wf="w", agent="a", prompt=10, output=2, app="app"):
    return PlacementRequest(wf, agent, prompt, output, app)


def views(*specs):
    """``(gpu, host, active)`` per replica, replica i at index i."""
    return [ReplicaView(i, g, h, a) for i, (g, h, a) in enumerate(specs)]


def test_round_robin_cycles_over_live_replicas_and_counts_switches():
    p = RoundRobinPlacement()
    picked = [p.place(req(), views((0, 0, 0), (0, 0, 0), (0, 0, 0))).replica for _ in range(4)]
    assert picked == [0, 1, 2, 0]
    s = p.statistics()
    assert (s.placed, s.switches, s.moved_workflows) == (4, 3, 1)


def test_kv_cost_is_dynamos_prefill_plus_active_blocks():
    r = req(prompt=10, output=2)
    assert kv_cost(r, ReplicaView(0, 4, 0, 5)) == 6 + 17
    assert kv_cost(r, ReplicaView(0, 4, 4, 5)) == pytest.approx(3 + 17)  # host at 0.75
    assert kv_cost(r, ReplicaView(0, 4, 0, 5), overlap_weight=2.0) == 12 + 17


def test_kv_picks_overlap_unless_the_load_outweighs_it():
    p = KvPlacement()
    assert p.place(req(), views((0, 0, 0), (8, 0, 0))).replica == 1
    assert p.place(req(wf="x"), views((0, 0, 0), (8, 0, 9))).replica == 0


def test_kv_affinity_holds_the_first_replica_while_it_lives():
    p = KvAffinityPlacement()
    assert p.place(req(), views((0, 0, 0), (8, 0, 0))).replica == 1
    assert p.place(req(), views((10, 0, 0), (0, 0, 50))).replica == 1
    d = p.place(req(), views((10, 0, 0)))  # replica 1 left
    assert (d.replica, d.moved) == (0, True)


def test_pbkv_places_a_new_workflow_where_the_least_context_is_pinned():
    p = PbkvPlacement(seed=0)
    p.place(req("w1", prompt=20), views((0, 0, 0), (0, 0, 0)))
    first = p.statistics()
    assert first.placed == 1
    w1 = p._workflows["w1"].replica
    d = p.place(req("w2", prompt=5), views((0, 0, 0), (0, 0, 0)))
    assert d.replica == 1 - w1
    assert p.bound_blocks(w1) == 20 and p.bound_blocks(1 - w1) == 5


def test_pbkv_stays_for_its_reuse_and_moves_for_a_larger_load_gap():
    p = PbkvPlacement(PbkvPlacementConfig(load_weight=0.1), seed=0)
    p.warm_start("app", ["a"], [("a", "a"), ("a", "END")])
    p.place(req(prompt=10), views((0, 0, 0), (0, 0, 0)))
    home = p._workflows["w"].replica
    p.done(req(prompt=10), home, 12)

    def load(active_home, active_other):
        specs = [(0, 0, 0), (0, 0, 0)]
        specs[home] = (12, 0, active_home)
        specs[1 - home] = (0, 0, active_other)
        return views(*specs)

    # reuse here: 12 blocks now plus the forecast's later calls; a gap of 100 blocks
    # is worth 10: stay
    assert p.place(req(prompt=14), load(100, 0)).replica == home
    # a gap of 1000 blocks is worth 100: move, and the context moves with it
    d = p.place(req(prompt=14), load(1000, 0))
    assert (d.replica, d.moved) == (1 - home, True)
    assert p.statistics().moved_workflows == 1


def test_pbkv_predicted_reuse_weights_each_agent_context_by_the_forecast():
    p = PbkvPlacement(PbkvPlacementConfig(gamma=0.5, horizon=2), seed=0)
    p.warm_start("app", ["a", "b"], [("a", "b"), ("b", "END")])
    p.place(req(agent="a"), views((0, 0, 0)))
    p.done(req(agent="a"), 0, 8)
    # the warm-started chain: after a comes b for sure, then END; a is never called
    # again, so its context is worth nothing to this workflow
    assert p.predicted_reuse("w", ["a"], 0) == 0.0
    p.place(req(agent="b"), views((0, 0, 0)))
    p.done(req(agent="b"), 0, 6)
    assert p.predicted_reuse("w", ["a"], 0) == pytest.approx(6.0)


def test_finish_forgets_the_workflow_and_releases_its_context():
    p = PbkvPlacement(seed=0)
    p.place(req(prompt=7), views((0, 0, 0)))
    assert p.bound_blocks(0) == 7
    p.finish("w")
    assert p.bound_blocks(0) == 0
    assert p.place(req(prompt=7), views((0, 0, 0))).moved is False


def test_unknown_placement_lists_the_known_ones():
    with pytest.raises(ValueError, match="round-robin, kv, kv-affinity, pbkv"):
        make_placement("nearest")


def test_empty_replica_list_is_refused():
    with pytest.raises(ValueError, match="at least one live replica"):
        RoundRobinPlacement().place(req(), [])


def test_in_flight_refuses_to_go_negative():
    f = InFlight()
    f.add(1, 5)
    f.remove(1, 5)
    assert f.of(1) == 0
    with pytest.raises(ValueError, match="replica 1"):
        f.remove(1, 1)
