import numpy as np
import pytest

from pbkv.predictor import Forecaster, OracleForecaster, WorkflowState


@pytest.fixture
def oracle() -> OracleForecaster:
    return OracleForecaster(
        ["A", "B", "C"], horizon=4, workflows={"w1": ("A", "B", "C"), "w2": ("C", "C")}
    )


def test_rows_are_the_true_future_then_end(oracle):
    rows = oracle.forecast(
        [
            WorkflowState("w1", "demo", ("A",)),
            WorkflowState("w2", "demo", ("C", "C")),
        ]
    )

    a, b, c, end = np.eye(4)
    np.testing.assert_array_equal(rows[0], [b, c, end, end])
    np.testing.assert_array_equal(rows[1], [end, end, end, end])
    assert oracle.name == "oracle"
    assert isinstance(oracle, Forecaster)


def test_unknown_workflow_is_rejected(oracle):
    with pytest.raises(ValueError, match="no workflow 'w9'"):
        oracle.forecast([WorkflowState("w9", "demo", ("A",))])


def test_path_must_be_a_prefix_of_the_truth(oracle):
    with pytest.raises(ValueError, match="not a prefix"):
        oracle.forecast([WorkflowState("w1", "demo", ("A", "C"))])


def test_workflows_must_use_known_agents():
    with pytest.raises(ValueError, match="unknown agent 'Q'"):
        OracleForecaster(["A"], horizon=1, workflows={"w": ("A", "Q")})
