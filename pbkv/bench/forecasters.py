"""The forecasters a bench row runs: an online model warm-started from the app's edges
(what ``open_runtime`` runs), or a model fitted before the run on another seed's
workflows, optionally behind the noise wrapper."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pbkv.actors.workload import Workflow
from pbkv.bench.config import BenchConfig
from pbkv.kvmanager import get_policy
from pbkv.live.build import ONLINE_PREDICTOR
from pbkv.predictor import CallGraph, NoiseForecaster, OnlineMarkovForecaster, make_forecaster
from pbkv.predictor.base import Forecaster
from pbkv.predictor.dataset import task_group
from pbkv.predictor.noise import OnlineNoiseForecaster

log = logging.getLogger(__name__)


def row_forecasters(
    config: BenchConfig,
    policy: str,
    fitted: Sequence[Forecaster],
    app: str,
    app_agents: Sequence[str],
    app_edges: Sequence[tuple[str, str]],
) -> list[Forecaster]:
    """Return one row's forecaster chain: ``fitted`` (a model fitted before the run), or
    for ``online`` a fresh online forecaster warm-started from the app's declared edges,
    as :func:`pbkv.live.serve_app` starts it (each row learns from its own run only)."""
    if not get_policy(policy).uses_forecasts:
        return []
    if config.predictor != ONLINE_PREDICTOR:
        return list(fitted)
    online = OnlineMarkovForecaster(horizon=config.horizon)
    if app_agents:
        online.warm_start(app, app_agents, app_edges)
    if config.noise > 0:
        return [OnlineNoiseForecaster(online, config.noise, seed=config.seed)]
    return [online]


def build_forecasters(
    config: BenchConfig,
    app_agents: Sequence[str],
    app_edges: Sequence[tuple[str, str]],
    workload: Sequence[Workflow],
    train: Sequence[Workflow],
) -> list[Forecaster]:
    """Return the predictor chain for ``config.predictor``, fitted on ``train``.

    Training workflows whose task appears in the workload are left out (τ-bench replays
    the same 200 episodes under every seed). A learned model falls back to markov-1.
    """
    agents = tuple(app_agents)
    seen = {task_group(w.to_trace()) for w in workload}
    traces = [t for t in (w.to_trace() for w in train) if task_group(t) not in seen]
    paths = {w.workflow_id: w.agents for w in workload}
    graph, added = CallGraph(agents, app_edges).widened(traces)
    if added:  # a fan-out app: its runs step between concurrent branches
        log.info("predictor call graph: %d transitions of the app's runs added to its edges", added)

    def build(name: str) -> Forecaster:
        return make_forecaster(
            name,
            agents=agents,
            horizon=config.horizon,
            traces=traces,
            workflows=paths,
            graph=graph,
            checkpoint=config.checkpoint,
        )

    chain = [build(config.predictor)]
    if config.predictor == "graphsage":
        chain.append(build("markov-1"))
    if config.noise > 0:
        chain = [NoiseForecaster(f, config.noise, seed=config.seed) for f in chain]
    return chain
