"""The time-aware score: gaps learned online, a workflow's weight by when it is back."""

import numpy as np
import pytest

from pbkv.kvmanager.node import Node
from pbkv.kvmanager.scoring import ScoreBoard
from pbkv.kvmanager.timing import MIN_SAMPLES, OWN_SAMPLES, GapModel, TimeWeights

from .conftest import FakeClock

AGENTS = ("fast", "slow")


def one_step(**probs):
    row = np.array([probs.get(a, 0.0) for a in AGENTS] + [0.0])
    row[-1] = 1.0 - row.sum()
    return row[None, :]


def board_with(workflows):
    """A board where each workflow touched one node of its own as agent ``fast``."""
    board = ScoreBoard(lambda node: None, gamma=0.8, beyond_horizon=False)
    nodes = {}
    for serial, w in enumerate(workflows):
        node = Node([serial], None, "", serial)
        board.start(w)
        board.touch([node], w, "fast")
        board.set_forecast(w, one_step(fast=0.9), AGENTS)
        nodes[w] = node
    return board, nodes


def test_remaining_gap_by_hand():
    gaps = GapModel()
    for g in (1.0, 2.0, 3.0, 4.0, 10.0, 10.0, 10.0, 40.0):
        gaps.observe("slow", g)
    assert gaps.typical_s() == 10.0  # the upper median of 8
    # own window too small: the pooled one (the same gaps here)
    assert gaps.remaining_s("slow", 0.0) == pytest.approx(80.0 / 8)
    assert gaps.remaining_s("slow", 3.5) == pytest.approx((4 + 10 + 10 + 10 + 40) / 5 - 3.5)
    assert gaps.remaining_s("slow", 10.0) == pytest.approx(30.0)  # only 40 is longer
    assert gaps.remaining_s("slow", 50.0) == 50.0  # longer than any seen: as long again


def test_nothing_is_said_before_enough_gaps():
    gaps = GapModel()
    for _ in range(MIN_SAMPLES - 1):
        gaps.observe("a", 5.0)
    assert gaps.typical_s() is None and gaps.remaining_s("a", 0.0) is None
    gaps.observe("a", -1.0)  # clamped to 0
    assert gaps.typical_s() == 5.0
    assert gaps.remaining_s("a", 0.0) == 5.0  # E[G | G > 0]: the zero gap is not longer


def test_an_agent_with_enough_gaps_of_its_own_uses_them():
    gaps = GapModel()
    for _ in range(OWN_SAMPLES):
        gaps.observe("fast", 1.0)
        gaps.observe("slow", 60.0)
    assert gaps.remaining_s("fast", 0.0) == 1.0
    assert gaps.remaining_s("slow", 0.0) == 60.0
    assert gaps.remaining_s("unseen", 0.0) == pytest.approx(30.5)  # pooled


def test_a_time_weight_scales_the_workflows_share_and_later_forecasts():
    board, nodes = board_with(["w1", "w2"])
    assert nodes["w1"].score == pytest.approx(0.9)
    assert board.set_time_weight("w1", 0.25) == 1
    assert nodes["w1"].score == pytest.approx(0.225) and nodes["w2"].score == pytest.approx(0.9)
    board.set_forecast("w1", one_step(fast=0.4), AGENTS)
    assert nodes["w1"].score == pytest.approx(0.1)
    assert board.next_step_value(nodes["w1"]) == pytest.approx(0.1)
    board.set_time_weight("w1", 1.0)
    assert nodes["w1"].score == pytest.approx(0.4)
    with pytest.raises(ValueError, match="time weight"):
        board.set_time_weight("w1", 0.0)
    assert board.set_time_weight("unknown", 0.5) == 0
    board.check_integrity()


def trained(clock):
    """Time weights over two workflows after ``fast`` gaps of 1 s and ``slow`` of 60 s."""
    board, nodes = board_with(["w1", "w2"])
    weights = TimeWeights(board, clock)
    for _ in range(OWN_SAMPLES):
        weights.gaps.observe("fast", 1.0)
        weights.gaps.observe("slow", 60.0)
    return board, nodes, weights


def test_a_workflow_gone_for_a_minute_yields_to_one_back_in_a_second():
    clock = FakeClock()
    board, nodes, weights = trained(clock)
    for w in ("w1", "w2"):
        weights.on_admitted(w)
    weights.on_released("w1", "slow")  # w1 waits on a minute-long tool
    weights.on_released("w2", "fast")
    d = weights.gaps.typical_s()
    assert d == 60.0  # the upper median of 16 short and 16 long gaps
    assert weights.weight("w1") == pytest.approx(d / (d + 60.0))
    assert weights.factor("fast", 0.0) == pytest.approx(d / (d + 1.0))
    assert weights.weight("w2") == 1.0  # within WEIGHT_STEP of 1: the nodes are not re-keyed
    assert nodes["w1"].score < nodes["w2"].score
    clock.advance(1.0)
    weights.on_invoked("w2")  # back: weight 1, its gap observed
    assert weights.weight("w2") == 1.0 and nodes["w2"].score == pytest.approx(0.9)
    assert weights.gaps.samples == 2 * OWN_SAMPLES + 1


def test_the_weight_follows_the_wait_under_a_heavy_tail():
    clock = FakeClock()
    board, nodes = board_with(["w"])
    weights = TimeWeights(board, clock)
    for g in [1.0] * 12 + [100.0] * 4:  # most gaps short, a quarter long
        weights.gaps.observe("a", g)
    weights.on_admitted("w")
    weights.on_released("w", "a")
    at_start = weights.weight("w")
    clock.advance(5.0)  # past every short gap: a long one is under way
    assert weights.refresh() == 1
    assert weights.weight("w") < at_start
    assert weights.weight("w") == pytest.approx(1.0 / (1.0 + 95.0))


def test_running_requests_keep_the_weight_at_one_and_a_terminated_workflow_is_forgotten():
    clock = FakeClock()
    board, nodes, weights = trained(clock)
    weights.on_admitted("w1")
    weights.on_admitted("w1")  # a fan-out: two requests
    weights.on_released("w1", "slow")
    assert weights.weight("w1") == 1.0  # one still runs
    weights.on_released("w1", "slow")
    assert weights.weight("w1") < 1.0
    weights.on_admitted("w1")  # a retracted request readmitted, or the next call
    assert weights.weight("w1") == 1.0
    weights.on_terminated("w1")
    weights.on_released("w1", "slow")  # late: ignored
    assert weights.weight("w1") == 1.0


def test_without_gaps_seen_the_score_is_eq_2():
    clock = FakeClock()
    board, nodes = board_with(["w"])
    weights = TimeWeights(board, clock)
    weights.on_admitted("w")
    weights.on_released("w", "a")
    assert weights.weight("w") == 1.0 and nodes["w"].score == pytest.approx(0.9)
    assert weights.refreshes == 0


def test_a_wait_begun_before_enough_gaps_is_weighed_once_they_are_seen():
    clock = FakeClock()
    board, nodes = board_with(["w", "v"])
    weights = TimeWeights(board, clock)
    weights.on_admitted("w")
    weights.on_released("w", "a")  # waits; no gap known, so weight 1 and no refresh due
    for _ in range(MIN_SAMPLES):  # other workflows' gaps of 1 s
        weights.on_admitted("v")
        weights.on_released("v", "a")
        clock.advance(1.0)
        weights.on_invoked("v")
    assert weights.weight("w") < 1.0  # weighed when the model reached MIN_SAMPLES
    clock.advance(600.0)
    assert weights.refresh() >= 1  # and refreshed as its wait grows
    assert weights.weight("w") == pytest.approx(weights.factor("a", clock() - 0.0))
    assert weights.weight("w") < 0.01


def test_a_retracted_request_keeps_its_workflow_at_weight_one_while_queued():
    clock = FakeClock()
    board, nodes, weights = trained(clock)
    weights.on_admitted("w1")
    weights.on_requeued("w1")  # retracted: waits for a slot, not on a tool
    assert weights.weight("w1") == 1.0 and nodes["w1"].score == pytest.approx(0.9)
    weights.on_admitted("w1")  # resumed
    weights.on_released("w1", "slow")  # now it ends: away
    assert weights.weight("w1") < 1.0


def test_the_expected_rest_of_a_gap_is_never_negative():
    """Float rounding: every longer gap barely above the wait so far."""
    gaps = GapModel()
    g = 93.91578613394343
    for _ in range(512):
        gaps.observe("a", g)
    e = np.nextafter(g, 0.0)
    assert gaps.remaining_s("a", e) >= 0.0
    weights = TimeWeights(board_with(["w"])[0], FakeClock(), gaps)
    assert weights.factor("a", e) <= 1.0
