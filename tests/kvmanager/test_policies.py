"""Policy keys (§5.2): the score's rounding is Python's ``round(x, 12)``, bit for bit."""

import math

import numpy as np
import pytest

from pbkv.kvmanager.policies import rounded_score


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
