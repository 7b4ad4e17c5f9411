"""Tests for engines/torchengine/stepcost.py (the measured stall-free budget)."""

from __future__ import annotations

import pytest

from pbkv.engines.torchengine.stepcost import StepCosts


def test_the_slack_is_unknown_until_prefill_and_decode_are_both_measured() -> None:
    costs = StepCosts()
    assert costs.prefill_slack_tokens() is None and costs.prefill_s_per_token is None
    costs.observe(0, 0.0, 0.04)  # a pure decode step
    assert costs.prefill_slack_tokens() is None
    costs.observe(100, 0.25, 0.0)  # a pure prefill step: 2.5 ms a token, overhead included
    assert costs.prefill_s_per_token == pytest.approx(0.0025)
    assert costs.prefill_slack_tokens() == 16  # 40 ms of decode / 2.5 ms a token


def test_the_per_token_time_is_the_fitted_slope_without_the_forward_overhead() -> None:
    costs = StepCosts(prefill_smoothing=0.5)
    for tokens in (100, 20, 100, 20, 60):  # 50 ms a forward + 2 ms a token
        costs.observe(tokens, 0.05 + 0.002 * tokens, 0.0)
    assert costs.prefill_s_per_token == pytest.approx(0.002)
    costs.observe(0, 0.0, 0.041)
    assert costs.prefill_slack_tokens() == 20  # 41 ms / 2 ms, not over the mean 2.9 ms


def test_chunks_of_one_size_fall_back_to_the_mean_time_per_token() -> None:
    costs = StepCosts()
    for seconds in (0.09, 0.11):  # same size: no slope to fit
        costs.observe(20, seconds, 0.0)
    assert costs.prefill_s_per_token == pytest.approx(0.0050, rel=0.02)
    noisy = StepCosts(prefill_smoothing=1.0)
    noisy.observe(20, 0.09, 0.0)
    assert noisy.prefill_s_per_token == pytest.approx(0.0045)  # only the newest is kept


def test_a_slope_that_is_not_positive_falls_back_to_the_mean() -> None:
    costs = StepCosts(prefill_smoothing=1.0)
    costs.observe(100, 0.2, 0.0)
    costs.observe(20, 0.2, 0.0)  # smoothing 1: only this step is left, one size
    assert costs.prefill_s_per_token == pytest.approx(0.01)
    shrinking = StepCosts(prefill_smoothing=0.5)
    shrinking.observe(20, 0.3, 0.0)
    shrinking.observe(100, 0.2, 0.0)  # more tokens, less time: noise, no slope
    assert shrinking.prefill_s_per_token == pytest.approx((0.5 * 0.3 + 0.2) / (0.5 * 20 + 100))


def test_the_decode_forward_is_a_moving_average_of_the_steps_that_decoded() -> None:
    costs = StepCosts(smoothing=0.5)
    costs.observe(0, 0.0, 0.04)
    costs.observe(50, 0.2, 0.0)  # no decode ran: 40 ms stays
    assert costs.decode_step_s == pytest.approx(0.04)
    costs.observe(0, 0.0, 0.08)
    assert costs.decode_step_s == pytest.approx(0.06)


@pytest.mark.parametrize("smoothing", [0.0, -0.1, 1.5])
def test_smoothing_outside_the_unit_interval_is_rejected(smoothing: float) -> None:
    with pytest.raises(ValueError, match="smoothing"):
        StepCosts(smoothing)
    with pytest.raises(ValueError, match="prefill_smoothing"):
        StepCosts(prefill_smoothing=smoothing)


def test_negative_figures_are_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        StepCosts().observe(-1, 0.1, 0.0)
