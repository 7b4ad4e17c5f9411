import numpy as np
import pytest

from pbkv.predictor import agent_weights, survival

# Conditional rows over (A, B, C, END) from the chain of test_markov's END test.
ROWS = np.array(
    [
        [0.25, 0, 0.25, 0.5],
        [0.125, 0.5, 0.125, 0.25],
        [1 / 24, 1 / 6, 1 / 24, 0.75],
    ]
)


def test_survival_is_the_product_of_earlier_continuations():
    np.testing.assert_allclose(survival(ROWS[None]), [[1, 0.5, 0.375]])
    np.testing.assert_allclose(survival(ROWS), [1, 0.5, 0.375])


def test_agent_weights_follow_eq_2_to_4():
    weights = agent_weights(np.stack([ROWS, ROWS]), gamma=0.5)

    # Step weights gamma^(k-1) s^(k) = 1, 0.25, 0.09375.
    a = 0.25 + 0.25 * 0.125 + 0.09375 / 24
    b = 0.25 * 0.5 + 0.09375 / 6
    np.testing.assert_allclose(weights, [[a, b, a], [a, b, a]])
    assert weights.shape == (2, 3)


def test_undecayed_weights_sum_to_expected_agent_steps():
    # With gamma = 1, sum_a u[a] = expected number of steps run within the horizon.
    assert agent_weights(ROWS, gamma=1.0).sum() == pytest.approx(0.5 + 0.375 + 0.09375)


@pytest.mark.parametrize("gamma", [0.0, 1.5])
def test_gamma_must_be_a_decay(gamma):
    with pytest.raises(ValueError, match="gamma"):
        agent_weights(ROWS, gamma)


def test_forecast_needs_step_and_column_axes():
    with pytest.raises(ValueError, match="shape"):
        survival(np.ones(4))
