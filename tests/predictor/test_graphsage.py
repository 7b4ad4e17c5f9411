import subprocess
import sys
from dataclasses import replace

import msgspec
import numpy as np
import pytest
import torch

from pbkv.predictor import END, CallGraph, WorkflowState, make_forecaster
from pbkv.predictor.checkpoint import CheckpointError, CheckpointInfo, save_checkpoint
from pbkv.predictor.features import encode_paths, reachability_masks, successor_edges
from pbkv.predictor.graphsage import GraphSageBatch, GraphSageConfig, GraphSageModel
from pbkv.predictor.graphsage_forecaster import GraphSageForecaster
from pbkv.predictor.scoring import score_forecaster
from pbkv.predictor.text import HashingEncoder
from pbkv.predictor.train import TrainConfig, fit_graphsage
from pbkv.predictor.vocab import agent_index

AGENTS = ("A", "B", "C", "D")
CYCLE = CallGraph(AGENTS, [("A", "B"), ("B", "C"), ("C", "D"), ("D", "A"), ("D", END)])
TINY = GraphSageConfig(
    agent_dim=8, hidden_dim=16, text_proj_dim=8, mlp_dim=32, attention_heads=2, dropout=0.0
)
FAST = TrainConfig(epochs=40, batch_size=32, learning_rate=1e-2, val_fraction=0.0)


def tiny_model(horizon: int, text_dim: int, stats: int = 3) -> GraphSageModel:
    config = GraphSageConfig(
        horizon=horizon,
        text_dim=text_dim,
        agent_dim=8,
        hidden_dim=16,
        text_proj_dim=8,
        mlp_dim=32,
        attention_heads=2,
    )
    torch.manual_seed(0)
    stats_table = np.arange(4 * stats, dtype=np.float32).reshape(4, stats) / 10
    return GraphSageModel(
        config, successor_edges(CYCLE), stats_table, reachability_masks(CYCLE, horizon)
    )


def batch_of(paths, text_dim: int, has_text) -> GraphSageBatch:
    encoded = encode_paths(agent_index(AGENTS), paths, max_prefix=32, max_positions=64)
    text = np.ones((len(paths), text_dim), dtype=np.float32)
    return GraphSageBatch.from_arrays(encoded, text, np.asarray(has_text))


@pytest.mark.parametrize("horizon", [1, 3])
@pytest.mark.parametrize("text_dim", [0, 6])
def test_shapes_on_a_4_node_graph(horizon, text_dim):
    model = tiny_model(horizon, text_dim).eval()
    paths = [("A",), ("A", "B", "C"), ("A", "B", "C", "D", "A")]
    batch = batch_of(paths, text_dim, [True, False, True])

    assert model.node_embeddings().shape == (4, 16)
    logits = model(batch)
    assert logits.shape == (3, horizon, 5)
    probs = model.probabilities(batch)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, horizon))
    if text_dim:
        assert model.text_summary(batch).shape == (3, 8)
        assert torch.all(model.text_summary(batch)[1] == 0)  # no text -> h_txt = 0


def test_impossible_columns_get_no_mass():
    model = tiny_model(3, 0).eval()
    with torch.no_grad():
        batch = batch_of([("A",), ("A", "B", "C", "D")], 0, [False, False])
        probs = model.probabilities(batch).numpy()
    # from A: B, then C, then D; from D: END or A, then B, then C
    assert probs[0, 0, 1] == pytest.approx(1.0)
    assert probs[0, 2, 3] == pytest.approx(1.0)
    assert probs[1, 0, [1, 2, 3]].sum() == 0.0
    assert probs[1, 0, [0, 4]].sum() == pytest.approx(1.0)
    assert probs[1, 1, 1] == pytest.approx(1.0)


def test_default_sizes_give_about_350k_parameters():
    graph = CallGraph(["p", "c", "t", "a"], [("p", "c"), ("c", "t"), ("t", "a"), ("a", "c")])
    model = GraphSageModel(
        GraphSageConfig(horizon=3, text_dim=576),
        successor_edges(graph),
        np.zeros((4, 11), dtype=np.float32),
        reachability_masks(graph, 3),
    )
    assert 300_000 <= model.parameter_count() <= 400_000


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="attention_heads"):
        GraphSageConfig(hidden_dim=10, attention_heads=4)
    with pytest.raises(ValueError, match="step_masks must have shape"):
        GraphSageModel(
            GraphSageConfig(horizon=2),
            successor_edges(CYCLE),
            np.zeros((4, 1), np.float32),
            reachability_masks(CYCLE, 3),
        )


def cycle_traces(make_record, n: int = 24):
    """Deterministic cycles: A B C D repeated twice, then END."""
    return [make_record(*("A", "B", "C", "D") * 2, task_id=f"t{i}") for i in range(n)]


def test_learns_a_deterministic_cycle(make_record):
    traces = cycle_traces(make_record)
    result = fit_graphsage(traces, CYCLE, config=TINY, train=FAST)
    forecaster = GraphSageForecaster(result.model, AGENTS)

    scores = score_forecaster(forecaster, traces)
    np.testing.assert_array_equal(scores.top1, [1.0, 1.0, 1.0])
    assert scores.mean_end_brier < 0.01
    assert len(result.history) == 40 and result.best_epoch == 40


def test_forecast_contract_and_checkpoint_round_trip(make_record, tmp_path):
    traces = cycle_traces(make_record, 8)
    vectors = HashingEncoder(8).encode([t.task_text for t in traces])
    result = fit_graphsage(
        traces,
        CYCLE,
        config=TINY,
        train=TrainConfig(epochs=2, val_fraction=0.0),
        text_vectors=vectors,
    )
    forecaster = GraphSageForecaster(result.model, AGENTS, text_encoder=HashingEncoder(8))
    states = [
        WorkflowState("w0", "demo", ("A",), "do it"),
        WorkflowState("w1", "demo", ("A", "B", "C", "D"), "", hidden=np.ones(8)),
    ]

    out = forecaster.forecast(states)
    assert out.dtype == np.float64 and out.shape == (2, 3, 5)
    np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-12)
    assert forecaster.forecast([]).shape == (0, 3, 5)

    info = CheckpointInfo(
        "demo",
        AGENTS,
        (("A", "B"), ("B", "C"), ("C", "D"), ("D", "A"), ("D", END)),
        result.model.config,
        None,
        {"traces": 8},
    )
    save_checkpoint(tmp_path / "ckpt", result.model, info)
    loaded = GraphSageForecaster.from_checkpoint(tmp_path / "ckpt", text_encoder=HashingEncoder(8))
    np.testing.assert_allclose(loaded.forecast(states), out, atol=1e-6)
    assert GraphSageForecaster.from_checkpoint(tmp_path / "ckpt", horizon=2).horizon == 2


def test_wrong_inputs_are_rejected(make_record, tmp_path):
    result = fit_graphsage(
        cycle_traces(make_record, 4),
        CYCLE,
        config=TINY,
        train=TrainConfig(epochs=1, val_fraction=0.0),
        text_vectors=np.zeros((4, 8), np.float32),
    )
    forecaster = GraphSageForecaster(result.model, AGENTS)
    with pytest.raises(ValueError, match="hidden has 3 values, the model takes 8"):
        forecaster.forecast([WorkflowState("w", "demo", ("A",), hidden=np.ones(3))])
    nan = np.ones(8, np.float32)
    nan[5] = np.nan
    ok = WorkflowState("ok", "demo", ("A",), hidden=np.ones(8, np.float32))
    with pytest.raises(ValueError, match="workflow 'bad': hidden holds a NaN"):
        forecaster.forecast([ok, WorkflowState("bad", "demo", ("A",), hidden=nan), ok])
    with pytest.raises(ValueError, match="unknown agent 'Z'"):
        forecaster.forecast([WorkflowState("w", "demo", ("Z",))])
    with pytest.raises(ValueError, match="horizon must be 1 to 3"):
        GraphSageForecaster(result.model, AGENTS, horizon=4)
    with pytest.raises(ValueError, match="gives 5 values; the model takes 8"):
        GraphSageForecaster(result.model, AGENTS, text_encoder=HashingEncoder(5))
    with pytest.raises(CheckpointError, match="graphsage.json is missing"):
        GraphSageForecaster.from_checkpoint(tmp_path)
    (tmp_path / "graphsage.json").write_text('{"format": "other"}')
    (tmp_path / "graphsage.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="format is 'other'"):
        GraphSageForecaster.from_checkpoint(tmp_path)


def test_registry_trains_on_traces_or_loads_a_checkpoint(make_record, tmp_path):
    traces = cycle_traces(make_record, 6)
    with pytest.raises(ValueError, match="needs checkpoint= or non-empty traces="):
        make_forecaster("graphsage", agents=AGENTS, horizon=3)
    trained = make_forecaster("graphsage", agents=AGENTS, horizon=2, traces=traces, graph=CYCLE)
    assert isinstance(trained, GraphSageForecaster)
    assert (trained.name, trained.agents, trained.horizon) == ("graphsage", AGENTS, 2)

    info = CheckpointInfo(
        "demo",
        AGENTS,
        (("A", "B"), ("B", "C"), ("C", "D"), ("D", "A"), ("D", END)),
        trained.model.config,
    )
    save_checkpoint(tmp_path, trained.model, info)
    loaded = make_forecaster("graphsage", agents=AGENTS, horizon=2, checkpoint=tmp_path)
    assert isinstance(loaded, GraphSageForecaster)
    with pytest.raises(ValueError, match="forecasts agents"):
        make_forecaster("graphsage", agents=AGENTS[::-1], horizon=2, checkpoint=tmp_path)


def test_importing_the_predictor_package_does_not_import_torch():
    code = (
        "import sys, pbkv.predictor as p; p.make_forecaster; "
        "assert 'torch' not in sys.modules and 'torch_geometric' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_single_query_attention_equals_multihead_attention():
    model = tiny_model(2, 0).eval()
    torch.manual_seed(1)
    query, keys = torch.randn(5, 16), torch.randn(5, 7, 16)
    padding = torch.zeros(5, 7, dtype=torch.bool)
    padding[1, 3:] = padding[4, 1:] = True
    expected, _ = model.attention(query[:, None], keys, keys, key_padding_mask=padding)
    with torch.no_grad():
        torch.testing.assert_close(model.attend(query, keys, padding), expected[:, 0])


def test_step_text_source_embeds_the_context_tail_over_the_task_text(make_record, tmp_path):
    from pbkv.predictor.graphsage_forecaster import text_inputs

    traces = [
        msgspec.structs.replace(
            r,
            steps=[
                msgspec.structs.replace(s, context_tail=f"tail {i}" if i % 2 else "")
                for i, s in enumerate(r.steps)
            ],
        )
        for r in cycle_traces(make_record, 4)
    ]
    encoder = HashingEncoder(8)
    inputs = text_inputs(encoder, traces, "step")
    assert inputs["example_text_vectors"].shape == (32, 8)
    np.testing.assert_array_equal(inputs["example_text_vectors"][1], encoder.encode(["tail 1"])[0])
    np.testing.assert_array_equal(inputs["example_text_vectors"][0], encoder.encode(["do it"])[0])
    result = fit_graphsage(
        traces, CYCLE, config=TINY, train=TrainConfig(epochs=1, val_fraction=0.0), **inputs
    )
    step = GraphSageForecaster(result.model, AGENTS, text_encoder=encoder, text_source="step")
    task = GraphSageForecaster(result.model, AGENTS, text_encoder=encoder, text_source="task")
    states = [
        WorkflowState("w0", "demo", ("A",), "do it", context_tail="user: yes please"),
        WorkflowState("w1", "demo", ("A",), "do it"),
        WorkflowState("w2", "demo", ("A",), "", hidden=np.full(8, 0.5), context_tail="x"),
        WorkflowState("w3", "demo", ("A",)),
    ]
    text, has = step.encode(states).text.numpy(), step.encode(states).has_text.numpy()
    expected = encoder.encode(["user: yes please", "do it"])
    np.testing.assert_array_equal(text[:2], expected)
    np.testing.assert_array_equal(text[2], np.full(8, 0.5))  # an engine's hidden state wins
    assert has.tolist() == [True, True, True, False]
    np.testing.assert_array_equal(task.encode(states).text.numpy()[0], expected[1])

    edges = (("A", "B"), ("B", "C"), ("C", "D"), ("D", "A"), ("D", END))
    info = CheckpointInfo("demo", AGENTS, edges, result.model.config, "hashing", {}, "step")
    save_checkpoint(tmp_path / "ckpt", result.model, info)
    loaded = GraphSageForecaster.from_checkpoint(tmp_path / "ckpt", text_encoder=encoder)
    assert loaded.text_source == "step"
    np.testing.assert_allclose(loaded.forecast(states), step.forecast(states), atol=1e-6)
    with pytest.raises(ValueError, match="text_source"):
        GraphSageForecaster(result.model, AGENTS, text_source="tail")  # type: ignore[arg-type]


def test_the_validation_split_holds_out_whole_tasks():
    from pbkv.predictor.train import _split

    tasks = np.repeat(np.array([f"task{i}" for i in range(10)]), 4)  # 4 trials each
    fit, val = _split(tasks, 0.2, np.random.default_rng(0))
    assert len(val) == 8 and len(fit) == 32
    assert set(tasks[fit]).isdisjoint(tasks[val])


def test_an_ensemble_averages_its_members_and_survives_a_checkpoint(make_record, tmp_path):
    from pbkv.predictor.graphsage import GraphSageEnsemble

    traces = cycle_traces(make_record, 8)
    reports = []
    result = fit_graphsage(
        traces, CYCLE, config=TINY, train=replace(FAST, members=2), on_epoch=reports.append
    )
    model = result.model
    assert isinstance(model, GraphSageEnsemble) and model.config.members == 2
    assert [(r.member, r.members) for r in reports[:1] + reports[-1:]] == [(0, 2), (1, 2)]
    assert len(result.history) == 80 and len(result.best_epochs) == 2
    single = fit_graphsage(traces, CYCLE, config=TINY, train=FAST).model
    assert model.parameter_count() == 2 * single.parameter_count()
    batch = batch_of([("A",), ("A", "B", "C", "D")], 0, [False, False])
    with torch.inference_mode():
        members = [m.probabilities(batch) for m in model.members]
        torch.testing.assert_close(model.probabilities(batch), (members[0] + members[1]) / 2)
        torch.testing.assert_close(torch.softmax(model(batch), -1), model.probabilities(batch))
    assert not torch.equal(members[0], members[1])  # different seeds, different members

    forecaster = GraphSageForecaster(model, AGENTS)
    np.testing.assert_array_equal(score_forecaster(forecaster, traces).top1, [1.0, 1.0, 1.0])
    edges = (("A", "B"), ("B", "C"), ("C", "D"), ("D", "A"), ("D", END))
    save_checkpoint(tmp_path / "ens", model, CheckpointInfo("demo", AGENTS, edges, model.config))
    loaded = GraphSageForecaster.from_checkpoint(tmp_path / "ens")
    assert isinstance(loaded.model, GraphSageEnsemble)
    states = [WorkflowState("w", "demo", ("A", "B"), "")]
    np.testing.assert_allclose(loaded.forecast(states), forecaster.forecast(states), atol=1e-6)
    with pytest.raises(ValueError, match="at least two members, got 1"):
        GraphSageEnsemble([single])
    import json

    sidecar = tmp_path / "ens" / "graphsage.json"
    raw = json.loads(sidecar.read_text())
    raw["config"]["members"] = 3
    sidecar.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="declares 3 ensemble member.*holds 2"):
        GraphSageForecaster.from_checkpoint(tmp_path / "ens")
    raw["config"]["members"] = 2.0
    sidecar.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="members must be an integer"):
        GraphSageForecaster.from_checkpoint(tmp_path / "ens")
    with pytest.raises(ValueError, match="members must be >= 1"):
        TrainConfig(members=0)
