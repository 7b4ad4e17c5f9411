"""Policy keys (§5.2): the score's rounding is Python's ``round(x, 12)``, bit for bit; pbkv's
key bands near-equal scores and ranks them by workflow age."""

import math

import numpy as np
import pytest

from pbkv.kvmanager.node import Node
from pbkv.kvmanager.policies import (
    NO_REUSE_BAND,
    SCORE_BAND_RATIO,
    rounded_score,
    score_band,
    workflow_priority,
)


def test_rounded_score_is_round_to_12_digits_bit_for_bit():
    rng = np.random.default_rng(0)
    values = rng.uniform(0.0, 10.0, 20_000).tolist()  # scores as the refresh leaves them
    values += (rng.uniform(-1.0, 1.0, 20_000) * 10.0 ** rng.uniform(-20, 5, 20_000)).tolist()
    values += [k / 8192 for k in range(-4096, 4096)]  # x * 1e12 exactly a tie: round's own
    halves = [(n + 0.5) / 1e12 for n in range(-2000, 2000)]  # at and beside ties
    values += halves + [math.nextafter(h, d) for h in halves for d in (-1.0, 1.0)]
    edge = 2.0**46 / 1e12
    values += [0.0, -0.0, 1e-13, -1e-13, 5e-13, edge, -edge, math.nextafter(edge, 0.0), 1e300]
    values += [math.inf, -math.inf]
    wrong = [x for x in values if rounded_score(x).hex() != round(x, 12).hex()]
    assert wrong == []
    assert math.isnan(rounded_score(math.nan))


@pytest.mark.parametrize("x", [-0.0, -1e-13, -4e-13])
def test_rounded_score_keeps_the_sign_of_zero(x):
    assert math.copysign(1.0, rounded_score(x)) == -1.0


def _node(score, oldest, *, queued=0, last_access_s=0.0, retired=False):
    node = Node([1], None, "", serial=oldest)
    node.score, node.queued, node.oldest = score, queued, oldest
    node.last_access_s, node.retired = last_access_s, retired
    return node


def test_workflow_key_ranks_near_equal_scores_by_workflow_age():
    # a young workflow's queued prefix scores a little more than an old one's context
    # between two calls; within one band the young workflow's cache goes first
    old = _node(2.20, oldest=4, last_access_s=1.0)
    young = _node(2.35, oldest=60, last_access_s=9.0)
    assert score_band(2.20) == score_band(2.35)
    assert workflow_priority(young) < workflow_priority(old)
    # a score lower by more than the band's ratio goes first, however old
    low = _node(2.20 / SCORE_BAND_RATIO**2, oldest=1, last_access_s=9.0)
    assert workflow_priority(low) < workflow_priority(young)


def test_workflow_key_keeps_retired_and_unscored_cache_first():
    retired = _node(5.0, oldest=1, retired=True)
    unscored = _node(0.0, oldest=1)
    faint = _node(1e-9, oldest=99)
    assert workflow_priority(retired) < workflow_priority(unscored) < workflow_priority(faint)
    assert score_band(0.0) == score_band(-0.0) == NO_REUSE_BAND < score_band(1e-300)


def test_workflow_key_counts_queued_requests_into_the_score():
    idle = _node(1.0, oldest=1)
    queued = _node(1.0, oldest=99, queued=1)
    assert workflow_priority(idle) < workflow_priority(queued)


@pytest.mark.parametrize("value", [1e-6, 0.5, 1.0, 1.1, 2.28, 7.0, 1e6])
def test_score_band_is_the_log_of_the_score_in_ratio_steps(value):
    band = score_band(value)
    assert SCORE_BAND_RATIO**band <= value * (1 + 1e-12)
    assert value < SCORE_BAND_RATIO ** (band + 1) * (1 + 1e-12)
