"""Forecasters by registry name (§6): ``graphsage``, ``markov``, ``markov-1..3``, ``online``,
``oracle``, ``uniform``.

``graphsage`` needs torch and torch-geometric; they are imported only when it is built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pbkv.predictor.base import Forecaster
from pbkv.predictor.callgraph import CallGraph
from pbkv.predictor.dataset import TextSource
from pbkv.predictor.markov import MarkovForecaster
from pbkv.predictor.online import OnlineMarkovForecaster
from pbkv.predictor.oracle import OracleForecaster
from pbkv.predictor.trace import TraceRecord
from pbkv.predictor.uniform import UniformForecaster

DEFAULT_MARKOV_ORDER = 1
"""Order of plain ``markov``: first order is the call graph's transition matrix ``A``."""


@dataclass(frozen=True, slots=True)
class ForecasterInputs:
    """What a registry factory may use; each factory takes only what it needs."""

    agents: tuple[str, ...]
    horizon: int
    traces: tuple[TraceRecord, ...]
    workflows: Mapping[str, Sequence[str]] | None
    graph: CallGraph | None
    smoothing: float
    checkpoint: str | os.PathLike[str] | None = None
    text_encoder: str | None = None
    text_source: TextSource = "task"


def _markov(order: int) -> Callable[[ForecasterInputs], Forecaster]:
    def build(inputs: ForecasterInputs) -> Forecaster:
        model = MarkovForecaster(
            inputs.agents,
            order=order,
            horizon=inputs.horizon,
            smoothing=inputs.smoothing,
            graph=inputs.graph,
        )
        return model.fit(inputs.traces)

    return build


def _online(inputs: ForecasterInputs) -> Forecaster:
    return OnlineMarkovForecaster(horizon=inputs.horizon)  # type: ignore[return-value]


def _oracle(inputs: ForecasterInputs) -> Forecaster:
    if inputs.workflows is None:
        raise ValueError("forecaster 'oracle' needs workflows=")
    return OracleForecaster(inputs.agents, horizon=inputs.horizon, workflows=inputs.workflows)


def _uniform(inputs: ForecasterInputs) -> Forecaster:
    return UniformForecaster(inputs.agents, horizon=inputs.horizon)


def _graphsage(inputs: ForecasterInputs) -> Forecaster:
    from pbkv.predictor.graphsage_forecaster import build_graphsage

    return build_graphsage(
        inputs.agents,
        horizon=inputs.horizon,
        traces=inputs.traces,
        graph=inputs.graph,
        checkpoint=inputs.checkpoint,
        text_encoder=inputs.text_encoder,
        text_source=inputs.text_source,
    )


_FACTORIES: dict[str, Callable[[ForecasterInputs], Forecaster]] = {
    "graphsage": _graphsage,
    "markov": _markov(DEFAULT_MARKOV_ORDER),
    "markov-1": _markov(1),
    "markov-2": _markov(2),
    "markov-3": _markov(3),
    "online": _online,
    "oracle": _oracle,
    "uniform": _uniform,
}


def forecaster_names() -> tuple[str, ...]:
    """Return the registered forecaster names, sorted."""
    return tuple(sorted(_FACTORIES))


def make_forecaster(
    name: str,
    *,
    agents: Sequence[str],
    horizon: int,
    traces: Iterable[TraceRecord] = (),
    workflows: Mapping[str, Sequence[str]] | None = None,
    graph: CallGraph | None = None,
    smoothing: float = 0.0,
    checkpoint: str | os.PathLike[str] | None = None,
    text_encoder: str | None = None,
    text_source: TextSource = "task",
) -> Forecaster:
    """Build the forecaster registered as ``name``.

    Inputs a forecaster does not use are ignored, so callers may pass all of them.

    Args:
        name: one of :func:`forecaster_names`; ``markov`` is ``markov-1``; ``online``
            learns as it serves (its vocabulary is per app; warm-start it with
            :meth:`~pbkv.predictor.online.OnlineMarkovForecaster.warm_start`).
        agents: the agent vocabulary, in column order.
        horizon: ``K``, steps forecast.
        traces: training traces (``markov*`` fit on them; empty leaves them untrained;
            ``graphsage`` trains on them when no ``checkpoint`` is given).
        workflows: ``workflow_id -> full agent path`` (required by ``oracle``).
        graph: the app's call graph (``markov*`` smooth only over its edges;
            ``graphsage`` trained here uses it, else the graph the traces walk).
        smoothing: additive pseudo-count (``markov*``).
        checkpoint: a ``graphsage`` checkpoint folder (then ``traces`` are not used).
        text_encoder: ``graphsage``'s task-text encoder name (``smollm2``, ``minilm``,
            ``hashing``); default: none when training here, the sidecar's when loading.
        text_source: what ``graphsage`` trained here embeds per state (``task`` or
            ``step``; see :func:`~pbkv.predictor.dataset.state_text`).

    Returns:
        A ready :class:`~pbkv.predictor.base.Forecaster`.

    Raises:
        ValueError: an unknown ``name`` (the message lists the known ones), a missing
            input, or an input the forecaster rejects.
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        known = ", ".join(forecaster_names())
        raise ValueError(f"unknown forecaster {name!r}; known forecasters: {known}")
    inputs = ForecasterInputs(
        tuple(agents),
        horizon,
        tuple(traces),
        workflows,
        graph,
        smoothing,
        checkpoint,
        text_encoder,
        text_source,
    )
    return factory(inputs)
