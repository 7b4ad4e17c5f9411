import numpy as np
import pytest

from pbkv.predictor import NoiseForecaster, OracleForecaster, WorkflowState


@pytest.fixture
def oracle() -> OracleForecaster:
    return OracleForecaster(["A", "B", "C"], horizon=2, workflows={"w": ("A", "B")})


STATES = [WorkflowState("w", "demo", ("A",))]


def test_mixes_with_uniform_exactly(oracle):
    noisy = NoiseForecaster(oracle, 0.2)

    rows = noisy.forecast(STATES)

    # 0.8 * one-hot + 0.2 * 1/4.
    np.testing.assert_allclose(rows[0], [[0.05, 0.85, 0.05, 0.05], [0.05, 0.05, 0.05, 0.85]])
    assert noisy.name == "oracle+noise0.2"
    assert (noisy.agents, noisy.horizon) == (("A", "B", "C"), 2)


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_extremes_are_the_inner_forecast_and_uniform(oracle, lam):
    rows = NoiseForecaster(oracle, lam).forecast(STATES)

    expected = oracle.forecast(STATES) if lam == 0 else np.full((1, 2, 4), 0.25)
    np.testing.assert_array_equal(rows, expected)


def test_seeded_noise_is_random_on_the_simplex_and_reproducible(oracle):
    first = NoiseForecaster(oracle, 0.5, seed=3).forecast(STATES)
    second = NoiseForecaster(oracle, 0.5, seed=3).forecast(STATES)

    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first.sum(axis=-1), 1.0)
    assert first[0, 0, 1] >= 0.5
    assert not np.allclose(first, NoiseForecaster(oracle, 0.5).forecast(STATES))


@pytest.mark.parametrize("lam", [-0.1, 1.5])
def test_lambda_must_be_a_weight(oracle, lam):
    with pytest.raises(ValueError, match="lam must be in"):
        NoiseForecaster(oracle, lam)
