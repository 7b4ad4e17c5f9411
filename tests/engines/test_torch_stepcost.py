"""Tests for engines/torchengine/stepcost.py (the measured step costs and stall-free budget)."""

from __future__ import annotations

import pytest

from pbkv.engines.torchengine.stepcost import StepCosts


def test_the_slack_is_unknown_until_a_mixed_step_is_measured() -> None:
    costs = StepCosts()
    assert costs.prefill_slack_tokens() is None and costs.prefill_s_per_token is None
    assert costs.observe(0, 2, 0.04) == 0.04  # a pure decode forward: all decode
    assert costs.prefill_slack_tokens() is None
    assert costs.observe(100, 0, 0.25) == 0.0  # a pure prefill: 2.5 ms a token
    assert costs.prefill_s_per_token == pytest.approx(0.0025)
    assert costs.prefill_slack_tokens() is None


def test_a_mixed_step_that_takes_every_tokens_time_hides_none() -> None:
    """A CPU: 32 tokens beside two decodes add their 2.5 ms each to the decode forward."""
    costs = StepCosts()
    costs.observe(0, 2, 0.04)
    costs.observe(100, 0, 0.25)
    assert costs.observe(32, 2, 0.04 + 32 * 0.0025) == pytest.approx(0.04)  # billed as alone
    assert costs.prefill_slack_tokens() == 0


def test_a_mixed_step_no_longer_than_its_decodes_hides_its_tokens() -> None:
    """A GPU: 64 tokens ride in the decode forward's idle compute; 200 tokens take the
    time of those past 150."""
    costs = StepCosts(smoothing=1.0)
    costs.observe(0, 4, 0.010)
    costs.observe(400, 0, 0.040)  # 0.1 ms a token
    costs.observe(64, 4, 0.010)
    assert costs.prefill_slack_tokens() == 64  # no more than it carried
    costs.observe(200, 4, 0.010 + 50 * 0.0001)
    assert costs.prefill_slack_tokens() == 150


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_the_slack_estimate_holds_under_small_chunks_and_noise(noise: float) -> None:
    """A GPU whose decode forward hides 500 tokens; the engine's chunks are capped at the
    estimate plus a block (16), and one step in four carries a 50-token prompt tail. A
    step that hid all its tokens only says the slack is at least that many, so tails
    and fast noise must not ratchet the estimate down."""
    import random

    rng = random.Random(0)
    costs = StepCosts()
    costs.observe(0, 4, 0.010)
    costs.observe(400, 0, 0.040)  # 0.1 ms a token
    for step in range(400):
        slack = costs.prefill_slack_tokens()
        budget = 2048 if slack is None or slack < 16 else slack + 16
        tokens = 50 if step % 4 == 3 else budget
        seconds = 0.010 + max(0, tokens - 500) * 0.0001
        costs.observe(tokens, 4, seconds * (1 + rng.uniform(-noise, noise)))
    assert 400 <= costs.prefill_slack_tokens() <= 600


def test_the_slack_estimate_follows_a_slack_that_shrinks_and_grows() -> None:
    """The probes (the estimate plus a block) see a slack that changes: a larger decode
    batch leaves less idle compute, a smaller one more."""
    costs = StepCosts()
    costs.observe(0, 4, 0.010)
    costs.observe(400, 0, 0.040)  # 0.1 ms a token
    for true_slack in (500, 200, 350):
        for _ in range(200):
            slack = costs.prefill_slack_tokens()
            tokens = 2048 if slack is None or slack < 16 else slack + 16
            costs.observe(tokens, 4, 0.010 + max(0, tokens - true_slack) * 0.0001)
        assert costs.prefill_slack_tokens() == pytest.approx(true_slack, abs=2)


def test_the_per_token_time_is_the_fitted_slope_without_the_forward_overhead() -> None:
    costs = StepCosts(prefill_smoothing=0.5)
    for tokens in (100, 20, 100, 20, 60):  # 50 ms a forward + 2 ms a token
        costs.observe(tokens, 0, 0.05 + 0.002 * tokens)
    assert costs.prefill_s_per_token == pytest.approx(0.002)


def test_the_decode_fit_splits_a_forward_from_its_rows() -> None:
    costs = StepCosts(smoothing=1.0, prefill_smoothing=0.5)
    for rows in (1, 4, 2, 8, 1):  # 60 ms a forward + 5 ms a row
        costs.observe(0, rows, 0.06 + 0.005 * rows)
    assert costs.forward_s == pytest.approx(0.06)
    assert costs.decode_s(3) == pytest.approx(0.075)
    # a mixed step bills its decodes the moving average of pure decode forwards
    assert costs.decode_step_s == pytest.approx(0.065)
    assert costs.observe(16, 3, 0.2) == pytest.approx(0.065)
    assert costs.observe(16, 3, 0.05) == pytest.approx(0.05)  # at most the forward
    slow = StepCosts(smoothing=1.0)
    for seconds in (0.5, 0.5, 0.1):  # one batch size: the mean, 0.37 s, per forward
        slow.observe(0, 2, seconds)
    assert slow.forward_s == pytest.approx(0.1)  # no more than a decode forward now
    same = StepCosts()
    for _ in range(3):
        same.observe(0, 4, 0.1)  # one batch size: no slope, all of it per forward
    assert same.forward_s == pytest.approx(0.1) and same.decode_s(1) == pytest.approx(0.1)


def test_chunks_of_one_size_fall_back_to_the_mean_time_per_token() -> None:
    costs = StepCosts()
    for seconds in (0.09, 0.11):  # same size: no slope to fit
        costs.observe(20, 0, seconds)
    assert costs.prefill_s_per_token == pytest.approx(0.0050, rel=0.02)
    noisy = StepCosts(prefill_smoothing=1.0)
    noisy.observe(20, 0, 0.09)
    assert noisy.prefill_s_per_token == pytest.approx(0.0045)  # only the newest is kept


def test_a_slope_that_is_not_positive_falls_back_to_the_mean() -> None:
    costs = StepCosts(prefill_smoothing=1.0)
    costs.observe(100, 0, 0.2)
    costs.observe(20, 0, 0.2)  # smoothing 1: only this step is left, one size
    assert costs.prefill_s_per_token == pytest.approx(0.01)
    shrinking = StepCosts(prefill_smoothing=0.5)
    shrinking.observe(20, 0, 0.3)
    shrinking.observe(100, 0, 0.2)  # more tokens, less time: noise, no slope
    assert shrinking.prefill_s_per_token == pytest.approx((0.5 * 0.3 + 0.2) / (0.5 * 20 + 100))


def test_the_decode_forward_is_a_moving_average_of_the_steps_that_decoded() -> None:
    costs = StepCosts(smoothing=0.5)
    costs.observe(0, 1, 0.04)
    costs.observe(50, 0, 0.2)  # no decode ran: 40 ms stays
    assert costs.decode_step_s == pytest.approx(0.04)
    costs.observe(0, 1, 0.08)
    assert costs.decode_step_s == pytest.approx(0.06)


@pytest.mark.parametrize("smoothing", [0.0, -0.1, 1.5])
def test_smoothing_outside_the_unit_interval_is_rejected(smoothing: float) -> None:
    with pytest.raises(ValueError, match="smoothing"):
        StepCosts(smoothing)
    with pytest.raises(ValueError, match="prefill_smoothing"):
        StepCosts(prefill_smoothing=smoothing)


def test_negative_figures_are_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        StepCosts().observe(-1, 0, 0.1)
    with pytest.raises(ValueError, match="non-negative"):
        StepCosts().observe(1, 0, -0.1)
