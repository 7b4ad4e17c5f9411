import numpy as np
import pytest

from pbkv.predictor import END, CallGraph, Forecaster, MarkovForecaster, WorkflowState


def _state(*path: str) -> WorkflowState:
    return WorkflowState(workflow_id="w", app="demo", path=path)


def _forecast(model: MarkovForecaster, *path: str) -> np.ndarray:
    return model.forecast([_state(*path)])[0]


@pytest.mark.parametrize("order", [1, 2, 3])
def test_deterministic_cycle_is_predicted_with_certainty(make_record, order):
    model = MarkovForecaster(["A", "B", "C"], order=order, horizon=4)
    model.fit([make_record(*("A", "B", "C") * 100)])

    rows = _forecast(model, "C", "A")

    # C -> A in 99 of 100 visits, C -> END once; every other transition is certain.
    np.testing.assert_allclose(rows, [[0, 1, 0, 0], [0, 0, 1, 0], [0.99, 0, 0, 0.01], [0, 1, 0, 0]])
    assert model.name == f"markov-{order}"
    assert isinstance(model, Forecaster)


def test_step_one_is_the_counted_frequencies(make_record):
    records = [make_record("A", "B"), make_record("A", "C"), make_record("A", "B")]
    records.append(make_record("A"))
    model = MarkovForecaster(["A", "B", "C"], horizon=1).fit(records)

    expected = [0, 0.5, 0.25, 0.25]
    np.testing.assert_array_equal(model.conditional(["A"]), expected)
    np.testing.assert_array_equal(_forecast(model, "B", "A"), [expected])


def test_rows_are_conditional_on_being_alive(make_record):
    # Counts: C -> END 2, C -> C 1, C -> A 1; A -> B 1; B -> END 1.
    records = [make_record("C"), make_record("C", "C"), make_record("C", "A", "B")]
    model = MarkovForecaster(["A", "B", "C"], horizon=3).fit(records)

    rows = _forecast(model, "C")

    # Step 2: alive mass 0.5 = A 0.25 (-> B) + C 0.25 (-> END/A/C 0.5/0.25/0.25).
    # Step 3: alive mass 0.375 = B 0.25 (-> END) + A 0.0625 (-> B) + C 0.0625 (as above).
    np.testing.assert_allclose(
        rows,
        [
            [0.25, 0, 0.25, 0.5],
            [0.0625 / 0.5, 0.25 / 0.5, 0.0625 / 0.5, 0.125 / 0.5],
            [1 / 24, 1 / 6, 1 / 24, 0.75],
        ],
    )


def test_rows_past_certain_end_are_end_one_hot(make_record):
    model = MarkovForecaster(["A", "B"], horizon=3).fit([make_record("A", "B")])

    np.testing.assert_array_equal(_forecast(model, "A"), [[0, 1, 0], [0, 0, 1], [0, 0, 1]])


@pytest.fixture
def two_loops(make_record):
    # A -> B is followed by A, C -> B by C: only order 2 can tell them apart.
    return [make_record("A", "B", "A"), make_record("C", "B", "C")]


def test_order_two_uses_the_longer_context(two_loops):
    first = MarkovForecaster(["A", "B", "C", "D"], order=1, horizon=2).fit(two_loops)
    second = MarkovForecaster(["A", "B", "C", "D"], order=2, horizon=2).fit(two_loops)

    np.testing.assert_array_equal(_forecast(second, "A", "B"), [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
    np.testing.assert_array_equal(
        _forecast(first, "A", "B"), [[0.5, 0, 0.5, 0, 0], [0, 0.5, 0, 0, 0.5]]
    )


def test_unseen_context_backs_off_to_shorter_ones(two_loops):
    model = MarkovForecaster(["A", "B", "C", "D"], order=2, horizon=1).fit(two_loops)

    # (B, B) unseen -> (B,): A or C.
    np.testing.assert_array_equal(model.conditional(["B", "B"]), [0.5, 0, 0.5, 0, 0])
    # A path shorter than the order uses what it has.
    np.testing.assert_array_equal(model.conditional(["A"]), [0, 0.5, 0, 0, 0.5])
    # D never seen -> order 0, all six transitions pooled: A 1, B 2, C 1, END 2.
    np.testing.assert_allclose(model.conditional(["A", "D"]), [1 / 6, 2 / 6, 1 / 6, 0, 2 / 6])


def test_untrained_model_is_uniform():
    model = MarkovForecaster(["A", "B"], horizon=2)

    np.testing.assert_allclose(_forecast(model, "A"), np.full((2, 3), 1 / 3))


def test_smoothing_without_graph_covers_every_column(make_record):
    model = MarkovForecaster(["A", "B", "C"], smoothing=1.0).fit([make_record("A", "B")])

    np.testing.assert_allclose(model.conditional(["A"]), [1 / 5, 2 / 5, 1 / 5, 1 / 5])


def test_smoothing_and_backoff_stay_on_graph_edges(make_record):
    graph = CallGraph(["C", "B", "A"], [("A", "B"), ("A", END), ("B", "A"), ("B", "C"), ("C", END)])
    model = MarkovForecaster(["A", "B", "C"], smoothing=1.0, graph=graph)
    untrained = MarkovForecaster(["A", "B", "C"], graph=graph)
    model.fit([make_record("A", "B", "C")])

    np.testing.assert_allclose(model.conditional(["A"]), [0, 2 / 3, 0, 1 / 3])
    np.testing.assert_allclose(model.conditional(["B"]), [1 / 3, 0, 2 / 3, 0])
    np.testing.assert_allclose(untrained.conditional(["A"]), [0, 0.5, 0, 0.5])


def test_order_zero_backoff_is_masked_by_the_graph(make_record):
    edges = [("A", "B"), ("B", END), ("C", "A"), ("C", END), ("D", "D")]
    graph = CallGraph(["A", "B", "C", "D"], edges)
    model = MarkovForecaster(["A", "B", "C", "D"], graph=graph).fit([make_record("A", "B")])

    # C and D are never contexts; the pooled counts are B 1, END 1. After C only END of
    # them is admissible; after D neither is, so D falls back to its only edge.
    np.testing.assert_array_equal(model.conditional(["C"]), [0, 0, 0, 0, 1])
    np.testing.assert_array_equal(model.conditional(["D"]), [0, 0, 0, 1, 0])


def test_update_learns_online_and_fit_resets(make_record):
    model = MarkovForecaster(["A", "B"], horizon=1)
    model.update(["A"], "B")
    model.update(["B", "A"], "B")
    model.update(["A"], END)

    np.testing.assert_allclose(model.conditional(["A"]), [0, 2 / 3, 1 / 3])

    model.fit([make_record("A", "A")])
    np.testing.assert_array_equal(model.conditional(["A"]), [0.5, 0, 0.5])


def test_graph_rejects_non_edges_and_other_agents(make_record):
    graph = CallGraph(["A", "B"], [("A", "B"), ("B", END)])
    model = MarkovForecaster(["A", "B"], graph=graph)

    with pytest.raises(ValueError, match="'A' -> 'A' is not an edge"):
        model.update(["A"], "A")
    with pytest.raises(ValueError, match="'A' -> 'END' is not an edge"):
        model.fit([make_record("A")])
    with pytest.raises(ValueError, match="graph agents"):
        MarkovForecaster(["A", "C"], graph=graph)


@pytest.mark.parametrize(
    ("path", "message"),
    [((), "at least the current agent"), (("A", "Z"), "unknown agent 'Z'; known agents: A, B")],
)
def test_bad_paths_are_rejected(path, message):
    model = MarkovForecaster(["A", "B"])

    with pytest.raises(ValueError, match=message):
        model.forecast([_state(*path)])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"order": 4}, "order"), ({"horizon": 0}, "horizon"), ({"smoothing": -1}, "smoothing")],
)
def test_bad_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MarkovForecaster(["A"], **kwargs)


def _random_traces(make_record, seed: int, count: int):
    rng = np.random.default_rng(seed)
    agents = ["A", "B", "C", "D"]
    return [
        make_record(*rng.choice(agents, size=rng.integers(2, 9)).tolist()) for _ in range(count)
    ]


@pytest.mark.parametrize("order", [1, 2, 3])
def test_rows_are_distributions(make_record, order):
    model = MarkovForecaster(["A", "B", "C", "D"], order=order, horizon=5, smoothing=0.3)
    model.fit(_random_traces(make_record, seed=order, count=50))

    rows = model.forecast([_state("A"), _state("D", "C", "B"), _state("B", "B")])

    assert rows.shape == (3, 5, 5)
    assert (rows >= 0).all()
    np.testing.assert_allclose(rows.sum(axis=-1), 1.0)


def test_order_one_matches_powers_of_the_transition_matrix(make_record):
    records = _random_traces(make_record, seed=7, count=200)
    model = MarkovForecaster(["A", "B", "C", "D"], horizon=4).fit(records)
    matrix = CallGraph.from_traces(records).transition_matrix(records)

    # pi_k = e_B A^k; step k marginal = agents of pi_k plus the END mass gained at k.
    pi = np.array([0, 1.0, 0, 0, 0])
    expected = []
    for _ in range(4):
        following = pi @ matrix
        alive = 1 - pi[-1]
        expected.append([*following[:-1], following[-1] - pi[-1]] / alive)
        pi = following
    np.testing.assert_allclose(_forecast(model, "B"), expected)


def test_failed_fit_leaves_the_model_unchanged(make_record):
    graph = CallGraph(["A", "B"], [("A", "B"), ("B", END)])
    model = MarkovForecaster(["A", "B"], graph=graph).fit([make_record("A", "B")])

    with pytest.raises(ValueError, match="'B' -> 'B' is not an edge"):
        model.fit([make_record("A", "B", "B")])

    np.testing.assert_array_equal(model.conditional(["A"]), [0, 1, 0])


def test_update_refreshes_cached_forecasts():
    model = MarkovForecaster(["A", "B"], horizon=1)
    model.update(["A"], "B")
    np.testing.assert_array_equal(_forecast(model, "A"), [[0, 1, 0]])

    model.update(["A"], END)

    np.testing.assert_array_equal(_forecast(model, "A"), [[0, 0.5, 0.5]])
