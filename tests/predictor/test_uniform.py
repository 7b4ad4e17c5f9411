import numpy as np
import pytest

from pbkv.predictor import UniformForecaster, WorkflowState


def test_every_entry_is_uniform_over_agents_and_end():
    model = UniformForecaster(["A", "B", "C"], horizon=2)

    rows = model.forecast([WorkflowState("w", "demo", ("A",)), WorkflowState("v", "demo", ("C",))])

    np.testing.assert_array_equal(rows, np.full((2, 2, 4), 0.25))
    assert model.name == "uniform"


def test_paths_are_checked():
    with pytest.raises(ValueError, match="unknown agent 'Z'"):
        UniformForecaster(["A"], horizon=1).forecast([WorkflowState("w", "demo", ("Z",))])
