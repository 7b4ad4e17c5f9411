"""Tests for engines/torchengine/stepcost.py (the measured stall-free budget)."""

from __future__ import annotations

import pytest

from pbkv.engines.torchengine.stepcost import StepCosts


def test_the_slack_is_unknown_until_prefill_and_decode_are_both_measured() -> None:
    costs = StepCosts()
    assert costs.prefill_slack_tokens() is None
    costs.observe(0, 0.0, 0.04)  # a pure decode step
    assert costs.prefill_slack_tokens() is None
    costs.observe(100, 0.2, 0.0)  # a pure prefill step: 2 ms a token
    assert costs.prefill_slack_tokens() == 20  # 40 ms of decode / 2 ms a token


def test_each_average_folds_only_the_steps_that_ran_its_part() -> None:
    costs = StepCosts(smoothing=0.5)
    costs.observe(100, 0.2, 0.04)
    costs.observe(50, 0.2, 0.0)  # 4 ms a token; no decode ran: 40 ms stays
    assert costs.prefill_s_per_token == pytest.approx(0.003)
    assert costs.decode_step_s == pytest.approx(0.04)
    costs.observe(0, 0.0, 0.08)
    assert costs.decode_step_s == pytest.approx(0.06)
    assert costs.prefill_slack_tokens() == 20  # int(0.06 / 0.003)


@pytest.mark.parametrize("smoothing", [0.0, -0.1, 1.5])
def test_smoothing_outside_the_unit_interval_is_rejected(smoothing: float) -> None:
    with pytest.raises(ValueError, match="smoothing"):
        StepCosts(smoothing)


def test_negative_figures_are_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        StepCosts().observe(-1, 0.1, 0.0)
