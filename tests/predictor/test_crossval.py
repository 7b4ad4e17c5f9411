"""Cross-validation by task: the deal, the pooling, and scores that match a manual run."""

import numpy as np
import pytest
from rich.console import Console

from pbkv.examples import get_app
from pbkv.predictor import make_forecaster
from pbkv.predictor.callgraph import CallGraph
from pbkv.predictor.crossval import cross_validate, pool_scores
from pbkv.predictor.dataset import task_folds
from pbkv.predictor.scoring import ForecastScores, score_forecaster
from pbkv.predictor.train import TrainConfig
from pbkv.predictor_commands import eval_predictor, trace_generate


def _trials(make_record, tasks: int, trials: int):
    paths = [("a", "b"), ("a", "a", "b"), ("a", "b", "a", "b")]
    return [
        make_record(*paths[(t + i) % 3], task_id=f"t{t}-{i}", task=f"task{t}")
        for t in range(tasks)
        for i in range(trials)
    ]


def test_every_trace_is_held_out_once_and_no_task_is_split(make_record):
    records = _trials(make_record, tasks=7, trials=3)
    folds = task_folds(records, 3, seed=4)
    held = [r.task_id for _, test in folds for r in test]
    assert sorted(held) == sorted(r.task_id for r in records)
    for train, test in folds:
        assert {r.task_features["task"] for r in train}.isdisjoint(
            r.task_features["task"] for r in test
        )
        assert len(train) + len(test) == len(records)
    assert [[r.task_id for r in t] for _, t in task_folds(records, 3, seed=4)] == [
        [r.task_id for r in t] for _, t in folds
    ]
    with pytest.raises(ValueError, match="folds must be >= 2"):
        task_folds(records, 1, seed=0)
    with pytest.raises(ValueError, match="cannot deal 7 task"):
        task_folds(records, 8, seed=0)


def test_pooling_weighs_each_fold_by_its_pairs():
    a = ForecastScores("m", np.array([1.0, 0.5]), np.array([0.0, 0.2]), np.array([1.0, 2.0]))
    b = ForecastScores("m", np.array([0.0, np.nan]), np.array([0.3, np.nan]), np.array([3.0, 0]))
    pooled = pool_scores([a, b])
    np.testing.assert_allclose(pooled.top1, [0.25, 0.5])
    np.testing.assert_allclose(pooled.end_brier, [0.225, 0.2])
    np.testing.assert_allclose(pooled.pairs, [4, 2])
    with pytest.raises(ValueError, match="one predictor"):
        pool_scores([a, ForecastScores("n", a.top1, a.end_brier, a.pairs)])


def test_cross_validation_matches_fitting_each_fold_by_hand():
    app = get_app("codegen")
    graph = CallGraph(app.agents, app.edges)
    records = [w.to_trace() for w in app.generate(30, seed=3)]
    result = cross_validate(records, graph, ["markov-1", "oracle"], folds=3, seed=1)
    by_hand = []
    for train, test in task_folds(records, 3, seed=1):
        markov = make_forecaster("markov-1", agents=app.agents, horizon=3, traces=train)
        by_hand.append(score_forecaster(markov, test))
    expected = pool_scores(by_hand)
    np.testing.assert_allclose(result.pooled[0].top1, expected.top1)
    assert result.pooled[0].pairs[0] == sum(len(r.steps) for r in records)
    np.testing.assert_allclose(result.pooled[1].top1, 1.0)  # the oracle reads each fold
    assert sum(result.fold_traces) == 30 and len(result.folds) == 3
    beats, scored = result.wins("oracle", "markov-1")
    assert beats.tolist() == [3, 3, 3] and scored.tolist() == [3, 3, 3]
    with pytest.raises(ValueError, match="unknown predictor 'lstm'; known: .*graphsage-notext"):
        cross_validate(records, graph, ["markov-1", "lstm"], folds=3)


def test_graphsage_is_trained_per_fold_and_reused_without_text(tmp_path, monkeypatch):
    monkeypatch.setenv("PBKV_CACHE_DIR", str(tmp_path / "cache"))
    app = get_app("codegen")
    graph = CallGraph(app.agents, app.edges)
    records = [w.to_trace() for w in app.generate(12, seed=0)]
    folds = []
    result = cross_validate(
        records,
        graph,
        ["graphsage", "graphsage-notext"],
        folds=2,
        text_encoder="hashing",
        train=TrainConfig(epochs=1),
        on_fold=folds.append,
    )
    assert folds == [1, 2]
    assert [s.name for s in result.pooled] == ["graphsage", "graphsage-notext"]
    assert all(0.0 <= v <= 1.0 for s in result.pooled for v in s.top1)


def test_eval_predictor_cross_validates_and_writes_json(tmp_path):
    traces = tmp_path / "t.jsonl"
    trace_generate("codegen", 20, 0, traces)
    quiet = Console(file=open(tmp_path / "progress.txt", "w"))  # noqa: SIM115
    out = tmp_path / "cv.json"
    eval_predictor("codegen", traces, ["markov-1", "oracle"], folds=4, json_path=out, console=quiet)
    import json

    document = json.loads(out.read_text())
    assert [s["predictor"] for s in document["scores"]] == ["markov-1", "oracle"]
    assert document["scores"][1]["top1"] == [1.0, 1.0, 1.0]
    assert [f["fold"] for f in document["folds"]] == [1, 2, 3, 4]
    assert sum(f["traces"] for f in document["folds"]) == 20
    with pytest.raises(ValueError, match="drop the checkpoint"):
        eval_predictor("codegen", traces, ["markov-1"], folds=2, train_traces=traces)
