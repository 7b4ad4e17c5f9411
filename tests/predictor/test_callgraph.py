import numpy as np
import pytest

from pbkv.predictor import END, CallGraph


def test_edges_and_successors_in_matrix_order():
    graph = CallGraph(["a", "b", "c"], [("a", "b"), ("b", "b"), ("b", "c"), ("c", END)])

    assert graph.successors("a") == ("b",)
    assert graph.successors("b") == ("b", "c")
    assert graph.successors("c") == (END,)
    assert graph.successors(END) == (END,)
    assert graph.is_admissible("b", "b")
    assert not graph.is_admissible("a", "c")
    assert graph.index(END) == 3


@pytest.mark.parametrize(
    ("agents", "edges", "message"),
    [
        (["a"], [("a", "zed")], "unknown agent 'zed'"),
        (["a"], [("zed", "a")], "unknown agent 'zed'"),
        (["a"], [(END, "a")], "unknown agent 'END'"),
        (["a", "a"], [], "'a' twice"),
        ([END], [], "may not contain 'END'"),
        ([], [], "at least one agent"),
    ],
)
def test_bad_graphs_are_rejected(agents, edges, message):
    with pytest.raises(ValueError, match=message):
        CallGraph(agents, edges)


def test_validate_path_names_the_bad_agent_or_transition():
    graph = CallGraph(["a", "b"], [("a", "b"), ("b", END)])

    graph.validate_path(["a", "b"])
    with pytest.raises(ValueError, match="unknown agent 'q'; known agents: a, b"):
        graph.validate_path(["a", "q"])
    with pytest.raises(ValueError, match="'b' -> 'a' is not an edge"):
        graph.validate_path(["a", "b", "a"])


def test_from_traces_collects_observed_edges(make_record):
    records = [make_record("p", "c", "c", "t"), make_record("p", "t")]

    graph = CallGraph.from_traces(records)

    assert graph.agents == ("c", "p", "t")
    assert graph.successors("p") == ("c", "t")
    assert graph.successors("c") == ("c", "t")
    assert graph.successors("t") == (END,)


def test_transition_matrix_is_row_normalised_counts_with_absorbing_end(make_record):
    records = [make_record("a", "b"), make_record("a", "a", "b"), make_record("a")]
    graph = CallGraph(["a", "b", "c"], [("a", "a"), ("a", "b"), ("a", END), ("b", END)])

    counts = graph.count_transitions(records)
    matrix = graph.transition_matrix(records)

    # a->b 2, a->a 1, a->END 1; b->END 2; c never seen and has no successors.
    np.testing.assert_array_equal(counts[0], [1, 2, 0, 1])
    np.testing.assert_array_equal(
        matrix,
        [[0.25, 0.5, 0, 0.25], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 1]],
    )


def test_transition_matrix_smooths_only_admissible_edges(make_record):
    graph = CallGraph(["a", "b"], [("a", "b"), ("a", END), ("b", "a")])

    matrix = graph.transition_matrix([make_record("a", "b", "a")], smoothing=1.0)

    # a: b 1+1, END 1+1 ; b: a 1+1, nothing else admissible.
    np.testing.assert_allclose(matrix, [[0, 0.5, 0.5], [1, 0, 0], [0, 0, 1]])


def test_unseen_row_without_smoothing_is_uniform_over_successors():
    graph = CallGraph(["a", "b"], [("a", "a"), ("a", "b"), ("a", END)])

    matrix = graph.transition_matrix([])

    np.testing.assert_allclose(matrix[0], [1 / 3, 1 / 3, 1 / 3])


def test_counting_rejects_non_edges(make_record):
    graph = CallGraph(["a", "b"], [("a", "b"), ("b", END)])

    with pytest.raises(ValueError, match="'b' -> 'b' is not an edge"):
        graph.count_transitions([make_record("a", "b", "b")])


def test_counting_rejects_ending_where_end_is_no_edge(make_record):
    graph = CallGraph(["a", "b"], [("a", "b"), ("b", END)])

    with pytest.raises(ValueError, match="'a' -> 'END' is not an edge"):
        graph.count_transitions([make_record("a")])


def test_widened_adds_exactly_the_transitions_the_traces_take_that_it_lacks(make_record):
    # a fan-out: s -> {m1, m2} -> r; a trace lists the branches one after the other
    graph = CallGraph(
        ["s", "m1", "m2", "r"], [("s", "m1"), ("s", "m2"), ("m1", "r"), ("m2", "r"), ("r", END)]
    )
    same, none = graph.widened([make_record("s", "m1", "r")])
    assert same is graph and none == 0
    wide, added = graph.widened([make_record("s", "m2", "m1", "r")])
    assert added == 1 and wide.is_admissible("m2", "m1") and not wide.is_admissible("m1", "m2")
    assert (wide.admissible | graph.admissible == wide.admissible).all()  # nothing dropped
    with pytest.raises(ValueError, match="unknown agent 'q'"):
        graph.widened([make_record("s", "q")])
