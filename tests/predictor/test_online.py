"""OnlineMarkovForecaster: learns per app and tenant as workflows end (issue 26, §7.5)."""

import numpy as np
import pytest

from pbkv.predictor import END, OnlineMarkovForecaster, WorkflowState


def state(path, app="app", tenant=""):
    return WorkflowState("w", app, tuple(path), tenant=tenant)


def test_an_untrained_model_is_uniform_over_what_it_knows():
    model = OnlineMarkovForecaster(horizon=1)
    [forecast] = model.forecast_each([state(["a"])])
    assert forecast.agents == ("a",)
    np.testing.assert_allclose(forecast.probabilities, [[0.5, 0.5]])


def test_warm_start_puts_the_mass_on_the_declared_edges():
    model = OnlineMarkovForecaster(horizon=2, order=1)
    model.warm_start(
        "app",
        ["plan", "code", "test"],
        [("plan", "code"), ("code", "test"), ("test", "code"), ("test", END)],
    )
    [forecast] = model.forecast_each([state(["plan"])])
    assert forecast.agents == ("plan", "code", "test")
    np.testing.assert_allclose(forecast.probabilities[0], [0, 1, 0, 0])
    np.testing.assert_allclose(forecast.probabilities[1], [0, 0, 1, 0])


def test_witten_bell_interpolates_counts_with_the_declared_edges():
    model = OnlineMarkovForecaster(horizon=1, order=1)
    model.warm_start("app", ["a", "b", "c"], [("a", "b"), ("a", "c")])
    model.observe("app", ["a", "b"])
    model.observe("app", ["a", "b"])
    [forecast] = model.forecast_each([state(["a"])])
    # N(a)=2, T(a)=1 (only b seen): P = (counts + 1 * base) / 3, base = 1/2 on b and c
    np.testing.assert_allclose(forecast.probabilities[0], [0, 2.5 / 3, 0.5 / 3, 0])


def test_unknown_agents_are_learned_not_refused():
    model = OnlineMarkovForecaster(horizon=1, order=1)
    model.observe("app", ["x", "y"])
    model.observe("app", ["x", "y"])
    [forecast] = model.forecast_each([state(["x"])])
    assert forecast.agents == ("x", "y")
    # no declared edges: the base is the pooled counts (x->y twice, y->END twice)
    np.testing.assert_allclose(forecast.probabilities[0], [0, (2 + 0.5) / 3, 0.5 / 3])


def test_order_two_separates_contexts_that_order_one_merges():
    model = OnlineMarkovForecaster(horizon=1, order=2)
    for _ in range(20):
        model.observe("app", ["a", "c", "x"])
        model.observe("app", ["b", "c", "y"])
    [after_a, after_b] = model.forecast_each([state(["a", "c"]), state(["b", "c"])])
    names = after_a.agents
    assert names[int(np.argmax(after_a.probabilities[0]))] == "x"
    assert names[int(np.argmax(after_b.probabilities[0]))] == "y"


def test_models_are_per_app_and_tenant():
    model = OnlineMarkovForecaster(horizon=1, order=1)
    for _ in range(5):
        model.observe("app", ["a", "b"], tenant="t1")
        model.observe("app", ["a", "c"], tenant="t2")
    [t1, t2] = model.forecast_each([state(["a"], tenant="t1"), state(["a"], tenant="t2")])
    assert t1.agents == ("a", "b") and t2.agents == ("a", "c")
    assert model.known_agents("app", "t1") == ("a", "b")
    assert model.known_agents("other") == ()


def test_accuracy_is_scored_before_learning_and_rises():
    model = OnlineMarkovForecaster(horizon=2, order=1)
    model.observe("app", ["a", "b"])
    first = model.accuracy()
    # the first workflow: 'a' unseen -> 'b' cannot be predicted; k=1 from a and from b,
    # k=2 from a (END); three predictions, all misses
    assert first.workflows == 1 and first.predictions == (2, 1)
    assert first.top1 == (0.0, 0.0)
    for _ in range(10):
        model.observe("app", ["a", "b"])
    later = model.accuracy()
    assert later.predictions == (22, 11)
    assert later.top1[0] > 0.8 and later.recent_top1[0] > later.top1[0] - 1e-9


def test_memory_is_bounded():
    model = OnlineMarkovForecaster(horizon=1, order=1, max_models=2, max_agents=3)
    model.observe("app", ["a", "b", "c", "d", "e"])
    assert model.known_agents("app") == ("a", "b", "c")
    [forecast] = model.forecast_each([state(["e"])])
    assert forecast is None  # past the vocabulary bound: no forecast, never an error
    model.observe("one", ["a"])
    model.observe("two", ["a"])
    assert model.known_agents("app") == ()  # the least recently used model went


@pytest.mark.parametrize("bad", [{"order": 0}, {"order": 4}, {"horizon": 0}, {"max_agents": 0}])
def test_bad_bounds_are_refused(bad):
    with pytest.raises(ValueError, match="must be"):
        OnlineMarkovForecaster(**bad)


def test_rows_are_distributions_conditional_on_alive():
    model = OnlineMarkovForecaster(horizon=3, order=2)
    for path in (["a", "b", "a", "b"], ["a", "b"], ["a", "c", "a"]):
        model.observe("app", path)
    [forecast] = model.forecast_each([state(["a", "b"])])
    assert forecast.probabilities.shape == (3, 4)
    np.testing.assert_allclose(forecast.probabilities.sum(axis=1), 1.0)
    assert (forecast.probabilities >= 0).all()


def test_noise_mixes_an_online_forecast_and_passes_learning_through():
    from pbkv.predictor.noise import OnlineNoiseForecaster

    inner = OnlineMarkovForecaster(horizon=1, order=1)
    noisy = OnlineNoiseForecaster(inner, 0.5)
    for _ in range(3):
        noisy.observe("app", ["a", "b"])
    [clean] = inner.forecast_each([state(["a"])])
    [mixed] = noisy.forecast_each([state(["a"])])
    assert mixed.agents == clean.agents == ("a", "b")
    np.testing.assert_allclose(mixed.probabilities, 0.5 * clean.probabilities + 0.5 / 3)
    assert noisy.accuracy() == inner.accuracy() and inner.accuracy().workflows == 3
