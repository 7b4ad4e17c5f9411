"""Tests for server/sampling.py: temperatures and top_p too small for float32 sampling."""

from __future__ import annotations

import pytest

from pbkv.server.sampling import MIN_TEMPERATURE, MIN_TOP_P, request_sampling


@pytest.mark.parametrize(
    ("temperature", "sent"),
    [(None, 1.0), (0.0, 0.0), (1e-46, MIN_TEMPERATURE), (5e-3, MIN_TEMPERATURE), (0.7, 0.7)],
)
def test_a_temperature_below_vllms_floor_is_raised_to_it_and_zero_stays_greedy(temperature, sent):
    sampling = request_sampling(temperature, None, None)
    assert sampling.temperature == sent
    assert sampling.greedy == (sent == 0.0)


@pytest.mark.parametrize(("top_p", "sent"), [(None, 1.0), (1e-46, MIN_TOP_P), (0.5, 0.5)])
def test_a_top_p_below_float32s_smallest_normal_is_raised_to_it(top_p, sent):
    assert request_sampling(0.5, top_p, 7).top_p == sent


def test_the_raised_top_p_is_still_positive_in_float32():
    import numpy

    assert numpy.float32(MIN_TOP_P) > 0 and numpy.float32(1e-46) == 0
