"""The folded forecast path gives the modules' own distributions, up to float rounding."""

import concurrent.futures

import numpy as np
import pytest
import torch

from pbkv.predictor import END, CallGraph, WorkflowState
from pbkv.predictor.features import encode_paths, reachability_masks, successor_edges
from pbkv.predictor.fused_graphsage import FusedGraphSage
from pbkv.predictor.graphsage import (
    GraphSageBatch,
    GraphSageConfig,
    GraphSageEnsemble,
    GraphSageModel,
)
from pbkv.predictor.graphsage_forecaster import GraphSageForecaster
from pbkv.predictor.vocab import agent_index

AGENTS = ("A", "B", "C", "D", "E")
GRAPH = CallGraph(
    AGENTS,
    [("A", "B"), ("B", "C"), ("B", "D"), ("C", "A"), ("D", "D"), ("D", "E"), ("E", "B")]
    + [("C", END), ("E", END)],
)


@pytest.fixture(autouse=True)
def one_thread():
    """Run on one torch thread, as the forecast does in a worker thread (and fast here:
    tiny ops on two busy cores spend most of their time waiting for the second thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_model(config: GraphSageConfig, seed: int) -> GraphSageModel:
    """A randomly initialised model whose norms and biases are not at their defaults."""
    torch.manual_seed(seed)
    stats = np.random.default_rng(seed).standard_normal((len(AGENTS), 3)).astype(np.float32)
    model = GraphSageModel(
        config, successor_edges(GRAPH), stats, reachability_masks(GRAPH, config.horizon)
    )
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                parameter.add_(0.3 * torch.randn_like(parameter))
    return model.eval()


def random_states(count: int, text_dim: int, seed: int, *, text_every: int = 1):
    """Random walks of 1..40 steps (past max_prefix and max_positions below)."""
    rng = np.random.default_rng(seed)
    states = []
    for i in range(count):
        path = [AGENTS[0]]
        for _ in range(int(rng.integers(0, 40))):
            path.append(str(rng.choice([a for a in GRAPH.successors(path[-1]) if a != END])))
        hidden = rng.standard_normal(text_dim).astype(np.float32) * 3
        has = text_dim and i % text_every == 0
        states.append(WorkflowState(f"w{i}", "demo", tuple(path), hidden=hidden if has else None))
    return states


def modules_probabilities(forecaster: GraphSageForecaster, states) -> np.ndarray:
    """What the modules' own forward gives (the path the forecaster took before folding)."""
    with torch.inference_mode():
        probs = forecaster.model.probabilities(forecaster.encode(states))
    out = probs[:, : forecaster.horizon].double().numpy()
    return out / out.sum(axis=-1, keepdims=True)


CONFIG = GraphSageConfig(
    horizon=3,
    text_dim=12,
    agent_dim=8,
    hidden_dim=16,
    text_proj_dim=8,
    mlp_dim=32,
    attention_heads=4,
    max_prefix=6,
    max_positions=10,
)


@pytest.mark.parametrize("members", [1, 3])
@pytest.mark.parametrize("text_dim", [0, 12])
@pytest.mark.parametrize("text_every", [1, 3])
def test_the_folded_forecast_matches_the_modules(members, text_dim, text_every):
    config = GraphSageConfig(**{**CONFIG.to_dict(), "text_dim": text_dim})
    models = [random_model(config, seed) for seed in range(members)]
    model = models[0] if members == 1 else GraphSageEnsemble(models).eval()
    forecaster = GraphSageForecaster(model, AGENTS)
    states = random_states(200, text_dim, seed=members, text_every=text_every)
    assert len({s.path for s in states}) > 100  # mostly distinct paths, some shared

    fast = forecaster.forecast(states)

    expected = modules_probabilities(forecaster, states)
    assert fast.shape == (200, 3, len(AGENTS) + 1)
    assert np.abs(fast - expected).max() <= 1e-5
    np.testing.assert_allclose(fast.sum(axis=-1), 1.0, rtol=0, atol=1e-12)


def test_the_fold_at_the_checkpoint_size_matches_the_modules():
    """The sizes of the timed checkpoint: 3 members, hidden 128, text 576, 4 heads."""
    config = GraphSageConfig(horizon=3, text_dim=576, members=1)
    ensemble = GraphSageEnsemble([random_model(config, seed) for seed in range(3)]).eval()
    forecaster = GraphSageForecaster(ensemble, AGENTS, horizon=2)
    states = random_states(32, 576, seed=7)

    fast = forecaster.forecast(states)

    assert fast.shape == (32, 2, len(AGENTS) + 1)
    assert np.abs(fast - modules_probabilities(forecaster, states)).max() <= 1e-5


def test_a_repeated_path_is_forecast_like_its_first_copy():
    forecaster = GraphSageForecaster(random_model(CONFIG, 0), AGENTS)
    states = random_states(5, 12, seed=3)
    twice = forecaster.forecast(states + states)
    np.testing.assert_allclose(twice[:5], twice[5:], rtol=0, atol=1e-6)  # GEMM rounding by row
    np.testing.assert_allclose(twice[:5], forecaster.forecast(states), rtol=0, atol=1e-6)
    assert np.abs(twice[0] - twice[1]).max() > 1e-3  # distinct states, distinct forecasts


def test_reused_scratch_leaks_nothing_between_forecasts_of_any_size():
    """The fused path reuses its scratch tensors: a forecast after larger and smaller
    ones, and ones run at once from threads, equals the modules' own."""
    forecaster = GraphSageForecaster(random_model(CONFIG, 0), AGENTS)
    batches = [random_states(n, 12, seed=n, text_every=2) for n in (40, 3, 17)]
    expected = [modules_probabilities(forecaster, states) for states in batches]
    for _ in range(2):
        for states, want in zip(batches, expected, strict=True):
            np.testing.assert_allclose(forecaster.forecast(states), want, rtol=0, atol=1e-5)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        got = list(pool.map(forecaster.forecast, batches * 4))
    for i, probs in enumerate(got):
        np.testing.assert_allclose(probs, expected[i % 3], rtol=0, atol=1e-5)


def test_changed_weights_are_folded_again():
    model = random_model(CONFIG, 0)
    forecaster = GraphSageForecaster(model, AGENTS)
    states = random_states(20, 12, seed=4)
    before = forecaster.forecast(states)
    fused = forecaster._fused
    assert fused is not None and fused.matches(model)

    with torch.no_grad():
        model.heads[0].bias[1] += 5.0  # an in-place update, as an optimiser step does
    after = forecaster.forecast(states)

    assert not fused.matches(model) and forecaster._fused is not fused
    assert np.abs(after - before).max() > 1e-3
    assert np.abs(after - modules_probabilities(forecaster, states)).max() <= 1e-5


def test_a_model_in_training_mode_keeps_its_dropout():
    model = random_model(GraphSageConfig(**{**CONFIG.to_dict(), "dropout": 0.5}), 0)
    forecaster = GraphSageForecaster(model, AGENTS)
    states = random_states(20, 12, seed=5)
    model.train()
    torch.manual_seed(0)
    first = forecaster.forecast(states)
    torch.manual_seed(1)
    assert not np.allclose(first, forecaster.forecast(states))  # dropout draws differ
    model.eval()
    np.testing.assert_allclose(
        forecaster.forecast(states), modules_probabilities(forecaster, states), atol=1e-5
    )


def test_the_fused_model_takes_distinct_paths_and_a_row_map():
    model = random_model(CONFIG, 2)
    fused = FusedGraphSage.from_model(model)
    paths = [("A",), ("A", "B", "D", "D")]
    encoded = encode_paths(agent_index(AGENTS), paths, max_prefix=6, max_positions=10)
    rows = torch.tensor([1, 0, 1])
    text = torch.randn(3, 12)
    has_text = torch.tensor([True, False, True])

    with torch.inference_mode():
        probs = fused.probabilities(encoded, rows, text, has_text, horizon=2)
        every = encode_paths(
            agent_index(AGENTS), [paths[1], paths[0], paths[1]], max_prefix=6, max_positions=10
        )
        expected = model.probabilities(GraphSageBatch.from_arrays(every, text.numpy(), has_text))

    assert probs.shape == (3, 2, len(AGENTS) + 1)
    torch.testing.assert_close(probs, expected[:, :2], rtol=0, atol=1e-6)
    assert float(probs[1, 0, AGENTS.index("B")]) > 0.0  # A -> B only
    assert float(probs[1, 0].sum() - probs[1, 0, AGENTS.index("B")]) < 1e-6


def test_a_model_made_under_inference_mode_is_folded_on_every_call():
    with torch.inference_mode():  # its tensors keep no version counter
        model = random_model(CONFIG, 1)
    forecaster = GraphSageForecaster(model, AGENTS)
    states = random_states(20, 12, seed=6)
    first = forecaster.forecast(states)
    fused = forecaster._fused
    assert fused is not None and not fused.matches(model)
    with torch.inference_mode():
        model.heads[0].bias[1] += 5.0  # invisible to a version check
    after = forecaster.forecast(states)
    assert forecaster._fused is not fused and np.abs(after - first).max() > 1e-3
    assert np.abs(after - modules_probabilities(forecaster, states)).max() <= 1e-5
