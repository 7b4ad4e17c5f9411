import numpy as np
import pytest

from pbkv.predictor import (
    END,
    CallGraph,
    MarkovForecaster,
    OracleForecaster,
    UniformForecaster,
    WorkflowState,
    forecaster_names,
    make_forecaster,
)


def test_names_are_listed():
    assert forecaster_names() == (
        "graphsage",
        "markov",
        "markov-1",
        "markov-2",
        "markov-3",
        "online",
        "oracle",
        "uniform",
    )


def test_unknown_name_lists_the_registry():
    with pytest.raises(
        ValueError,
        match="unknown forecaster 'lstm'; known forecasters: graphsage, markov, markov-1, "
        "markov-2, markov-3, online, oracle, uniform",
    ):
        make_forecaster("lstm", agents=["A"], horizon=1)


@pytest.mark.parametrize(("name", "order"), [("markov", 1), ("markov-2", 2), ("markov-3", 3)])
def test_markov_names_build_fitted_models(make_record, name, order):
    graph = CallGraph(["A", "B"], [("A", "B"), ("A", END), ("B", "A"), ("B", END)])
    model = make_forecaster(
        name,
        agents=["A", "B"],
        horizon=2,
        traces=[make_record("A", "B")],
        graph=graph,
        smoothing=1.0,
        workflows={"ignored": ("A",)},
    )

    assert isinstance(model, MarkovForecaster)
    assert (model.name, model.order, model.horizon, model.smoothing) == (
        f"markov-{order}",
        order,
        2,
        1.0,
    )
    np.testing.assert_allclose(model.conditional(["A"]), [0, 2 / 3, 1 / 3])


def test_oracle_needs_workflows():
    with pytest.raises(ValueError, match="'oracle' needs workflows="):
        make_forecaster("oracle", agents=["A"], horizon=1)

    oracle = make_forecaster("oracle", agents=["A"], horizon=1, workflows={"w": ("A",)})
    assert isinstance(oracle, OracleForecaster)
    np.testing.assert_array_equal(oracle.forecast([WorkflowState("w", "demo", ("A",))]), [[[0, 1]]])


def test_uniform_builds():
    assert isinstance(make_forecaster("uniform", agents=["A"], horizon=3), UniformForecaster)
