"""Inputs of the GraphSAGE forecaster: features, labels, examples, splits, scores, text."""

import msgspec
import numpy as np
import pytest

from pbkv.predictor import END, CallGraph, MarkovForecaster, UniformForecaster, top1_accuracy
from pbkv.predictor.dataset import (
    build_examples,
    embed_texts,
    example_texts,
    split_records,
    state_text,
)
from pbkv.predictor.features import (
    AGENT_STATISTICS,
    IGNORE_LABEL,
    agent_statistics,
    encode_paths,
    reachability_masks,
    step_labels,
    successor_edges,
)
from pbkv.predictor.scoring import score_forecaster
from pbkv.predictor.text import (
    CachedEncoder,
    HashingEncoder,
    make_text_encoder,
    text_encoder_names,
)
from pbkv.predictor.vocab import agent_index

CODEGEN = CallGraph(
    ["planner", "coder", "tester", "analyzer"],
    [
        ("planner", "coder"),
        ("coder", "tester"),
        ("tester", "analyzer"),
        ("tester", END),
        ("analyzer", "coder"),
    ],
)


def test_step_labels_follow_the_conditional_convention():
    index = agent_index(["A", "B"])
    assert step_labels(index, ("A", "B", "A"), 3).tolist() == [
        [1, 0, 2],
        [0, 2, IGNORE_LABEL],
        [2, IGNORE_LABEL, IGNORE_LABEL],
    ]


def test_reachability_masks_of_the_codegen_graph():
    masks = reachability_masks(CODEGEN, 3).astype(int)
    # columns: planner, coder, tester, analyzer, END
    assert masks[0].tolist() == [
        [0, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1],
        [0, 1, 0, 0, 0],
    ]
    assert masks[1, 2].tolist() == [0, 1, 0, 0, 0]  # tester, alive at t+2: analyzer ran
    assert masks[2, 0].tolist() == [0, 0, 0, 1, 1]  # planner -> coder -> tester -> ?


def test_message_edges_point_from_successor_to_agent():
    edges = successor_edges(CODEGEN)
    assert sorted(map(tuple, edges.T.tolist())) == [(1, 0), (1, 3), (2, 1), (3, 2)]


def test_encode_paths_keeps_the_last_agents_with_their_positions():
    index = agent_index(["A", "B"])
    encoded = encode_paths(index, [("A",), ("A", "B", "A", "B")], max_prefix=3, max_positions=3)
    assert encoded.current.tolist() == [0, 1]
    assert encoded.prefix.tolist() == [[0, 0, 0], [1, 0, 1]]
    assert encoded.positions.tolist() == [[0, 0, 0], [1, 2, 2]]
    assert encoded.padding.tolist() == [[False, True, True], [False, False, False]]
    assert encoded.current_position.tolist() == [0, 2]
    assert encoded.recency.tolist() == [[0, 0, 0], [2, 1, 0]]
    with pytest.raises(ValueError, match="at least the current agent"):
        encode_paths(index, [()], max_prefix=3, max_positions=3)


def test_agent_statistics_are_standardised_columns(make_record):
    records = [make_record("planner", "coder", "tester"), make_record("planner", "coder")]
    stats = agent_statistics(CODEGEN, records)
    assert stats.shape == (4, len(AGENT_STATISTICS)) and stats.dtype == np.float32
    np.testing.assert_allclose(stats.mean(axis=0), 0.0, atol=1e-6)
    assert set(np.round(stats.std(axis=0), 5)) <= {0.0, 1.0}


def test_examples_hold_every_prefix_with_its_text(make_record):
    records = [make_record("A", "B"), make_record(), make_record("B")]
    vectors = np.arange(6, dtype=np.float32).reshape(3, 2)
    examples = build_examples(
        records, ["A", "B"], horizon=2, max_prefix=4, max_positions=8, text_vectors=vectors
    )
    assert len(examples) == 3
    assert examples.trace.tolist() == [0, 0, 2]
    assert examples.labels.tolist() == [[1, 2], [2, IGNORE_LABEL], [2, IGNORE_LABEL]]
    assert examples.text.tolist() == [[0, 1], [0, 1], [4, 5]]
    with pytest.raises(ValueError, match="2 rows for 3 records"):
        build_examples(
            records, ["A", "B"], horizon=2, max_prefix=4, max_positions=8, text_vectors=vectors[:2]
        )


def test_split_by_task_keeps_the_trials_of_a_task_together(make_record):
    records = [
        make_record("A", task_id=f"{task}-{trial}", task=str(task))
        for task in range(10)
        for trial in range(4)
    ]
    train, test = split_records(records, 0.25, seed=3, by_task=True)
    assert (len(train), len(test)) == (32, 8)
    assert not {r.task_id.split("-")[0] for r in train} & {r.task_id.split("-")[0] for r in test}
    assert split_records(records, 0.25, seed=3, by_task=True) == (train, test)
    with pytest.raises(ValueError, match="test_fraction"):
        split_records(records, 1.0, seed=0)


def test_generated_traces_each_form_their_own_task(make_record):
    records = [make_record("A", task_id=f"1-{i}") for i in range(20)]
    train, test = split_records(records, 0.25, seed=0, by_task=True)
    assert (len(train), len(test)) == (15, 5)
    with pytest.raises(ValueError, match="cannot split 3 traces of 1 task"):
        split_records([make_record("A", task_id="x", task="t")] * 3, 0.25, seed=0, by_task=True)


def test_scores_match_top1_accuracy_and_an_exact_brier(make_record):
    graph = CallGraph(["A", "B"], [("A", "B"), ("B", "A"), ("B", END)])
    records = [make_record("A", "B"), make_record("A", "B", "A", "B")]
    markov = MarkovForecaster(["A", "B"], horizon=3, graph=graph).fit(records)
    scores = score_forecaster(markov, records, batch_size=2)
    # batches of 2 and one batch of all states score alike
    np.testing.assert_allclose(scores.top1, top1_accuracy(markov, records))
    assert scores.pairs.tolist() == [6, 4, 2]
    # k=1 by hand: after A comes B (3 of 3); after B, END (2 of 3) is predicted, so only
    # the second trace's B -> A is missed
    assert scores.top1[0] == pytest.approx(5 / 6)

    uniform = score_forecaster(UniformForecaster(["A", "B"], horizon=1), records)
    # 6 pairs with P[END] = 1/3: two END labels, four agent labels
    assert uniform.end_brier[0] == pytest.approx((2 * (2 / 3) ** 2 + 4 * (1 / 3) ** 2) / 6)
    assert uniform.mean_end_brier == pytest.approx(uniform.end_brier[0])


def test_hashing_encoder_is_deterministic_and_normalised():
    encoder = HashingEncoder(16)
    a, b, empty = encoder.encode(["Tricky concurrency bug", "tricky CONCURRENCY bug", ""])
    np.testing.assert_array_equal(a, b)
    assert np.linalg.norm(a) == pytest.approx(1.0) and not empty.any()


def test_cached_encoder_embeds_each_text_once_across_instances(tmp_path):
    class Counting(HashingEncoder):
        def __init__(self):
            super().__init__(8)
            self.seen = []

        def encode(self, texts):
            self.seen += list(texts)
            return super().encode(texts)

    inner = Counting()
    first = CachedEncoder(inner, tmp_path).encode(["x", "y", "x"])
    second = CachedEncoder(inner, tmp_path).encode(["y", "x"])
    assert inner.seen == ["x", "y"]
    np.testing.assert_array_equal(second, first[[1, 0]])
    assert len(list((tmp_path / "hashing-8").rglob("*.npy"))) == 2


def test_cached_encoder_keeps_an_encoder_version_apart(tmp_path):
    class Versioned(HashingEncoder):
        cache_name = "hashing-8-v2"

    CachedEncoder(Versioned(8), tmp_path).encode(["x"])
    assert [p.name for p in tmp_path.iterdir()] == ["hashing-8-v2"]


def test_text_encoders_by_name():
    assert text_encoder_names() == ("hashing", "minilm", "smollm2")
    assert make_text_encoder("smollm2", cache=False).dim == 576
    with pytest.raises(ValueError, match="unknown text encoder 'bert'; known text encoders"):
        make_text_encoder("bert")


def test_state_text_prefers_the_step_tail_with_the_step_source():
    assert state_text("task", "user: yes", "step") == "user: yes"
    assert state_text("task", "", "step") == "task"
    assert state_text("task", "user: yes", "task") == "task"
    assert state_text("", "", "step") == ""
    with pytest.raises(ValueError, match="text source"):
        state_text("task", "", "tail")  # type: ignore[arg-type]


def test_step_examples_embed_each_steps_tail(make_record):
    record = make_record("A", "B", "A")
    tails = ["user: hi", "", "tool: {}"]
    record = msgspec.structs.replace(
        record,
        steps=[
            msgspec.structs.replace(s, context_tail=t)
            for s, t in zip(record.steps, tails, strict=True)
        ],
    )
    empty = msgspec.structs.replace(make_record("B"), task_text="")
    texts = example_texts([record, empty], "step")
    assert texts == ["user: hi", "do it", "tool: {}", ""]
    assert example_texts([record], "task") == ["do it"] * 3

    encoder = HashingEncoder(8)
    vectors, present = embed_texts(encoder, texts)
    assert present.tolist() == [True, True, True, False]
    np.testing.assert_array_equal(vectors[:3], encoder.encode(texts[:3]))
    assert not vectors[3].any()

    examples = build_examples(
        [record, empty],
        ["A", "B"],
        horizon=1,
        max_prefix=4,
        max_positions=8,
        example_text_vectors=vectors,
        example_has_text=present,
    )
    np.testing.assert_array_equal(examples.text, vectors)
    assert examples.has_text.tolist() == [True, True, True, False]
    with pytest.raises(ValueError, match="3 rows for 4 examples"):
        build_examples(
            [record, empty],
            ["A", "B"],
            horizon=1,
            max_prefix=4,
            max_positions=8,
            example_text_vectors=vectors[:3],
        )
