import numpy as np
import pytest

from pbkv.predictor import (
    MarkovForecaster,
    OracleForecaster,
    UniformForecaster,
    top1_accuracy,
)


@pytest.fixture
def records(make_record):
    return [
        make_record("A", "B", task_id="r1"),
        make_record("A", "C", task_id="r2"),
        make_record("A", "B", task_id="r3"),
        make_record("A", task_id="r4"),
    ]


def test_markov_accuracy_per_step_counts_end_as_a_label(records):
    model = MarkovForecaster(["A", "B", "C"], horizon=2).fit(records)

    # Step 1: 7 scored pairs; B is predicted after A (wrong for r2 and r4), END after B/C.
    # Step 2: 3 scored pairs (only while alive), END predicted and true for all.
    np.testing.assert_allclose(top1_accuracy(model, records), [5 / 7, 1.0])


def test_oracle_is_perfect_and_uniform_picks_the_first_column(records):
    oracle = OracleForecaster(
        ["A", "B", "C"], horizon=3, workflows={r.task_id: r.agents for r in records}
    )
    uniform = UniformForecaster(["A", "B", "C"], horizon=2)

    # No trace is alive before step 3 (none runs more than two agents).
    np.testing.assert_array_equal(top1_accuracy(oracle, records), [1.0, 1.0, np.nan])
    np.testing.assert_array_equal(top1_accuracy(uniform, records), [0.0, 0.0])


def test_horizon_selects_leading_steps(records):
    model = MarkovForecaster(["A", "B", "C"], horizon=2).fit(records)

    np.testing.assert_allclose(top1_accuracy(model, records, horizon=1), [5 / 7])
    with pytest.raises(ValueError, match="horizon must be 1 to 2"):
        top1_accuracy(model, records, horizon=3)


def test_no_scored_pairs_is_nan():
    model = MarkovForecaster(["A"], horizon=2)

    assert np.isnan(top1_accuracy(model, [])).all()


def test_unknown_agents_in_records_are_rejected(make_record):
    with pytest.raises(ValueError, match="unknown agent 'Z'"):
        top1_accuracy(MarkovForecaster(["A"]), [make_record("A", "Z")])
