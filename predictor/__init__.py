"""Forecasters of which agents a workflow runs next (§6).

Every forecaster returns, per workflow, a ``(K, |V|+1)`` array whose row ``k-1`` is the
distribution of step ``t+k`` given the workflow is alive before it (``END`` last); see
:mod:`pbkv.predictor.base`.

The GraphSAGE model and its training need torch and torch-geometric; their names below
(``GraphSageForecaster``, ``GraphSageModel``, ``GraphSageConfig``, ``TrainConfig``,
``fit_graphsage``, ``save_checkpoint``, ``load_checkpoint``, ``CheckpointInfo``,
``CheckpointError``) are imported on first use, so ``import pbkv.predictor`` never imports
torch.
"""

import importlib
from typing import Any

from pbkv.predictor.base import Forecast, Forecaster, WorkflowState
from pbkv.predictor.callgraph import CallGraph
from pbkv.predictor.dataset import split_records
from pbkv.predictor.evaluation import top1_accuracy
from pbkv.predictor.markov import MarkovForecaster
from pbkv.predictor.noise import NoiseForecaster
from pbkv.predictor.online import OnlineAccuracy, OnlineMarkovForecaster
from pbkv.predictor.oracle import OracleForecaster
from pbkv.predictor.registry import DEFAULT_MARKOV_ORDER, forecaster_names, make_forecaster
from pbkv.predictor.scoring import ForecastScores, score_forecaster
from pbkv.predictor.text import TextEncoder, make_text_encoder, text_encoder_names
from pbkv.predictor.trace import (
    END,
    TRACE_VERSION,
    SegmentCount,
    TraceFileError,
    TraceLineError,
    TraceReadResult,
    TraceRecord,
    TraceStep,
    read_traces,
    write_traces,
)
from pbkv.predictor.uniform import UniformForecaster
from pbkv.predictor.weights import agent_weights, survival

_LAZY = {
    "CheckpointError": "pbkv.predictor.checkpoint",
    "CheckpointInfo": "pbkv.predictor.checkpoint",
    "GraphSageConfig": "pbkv.predictor.graphsage",
    "GraphSageForecaster": "pbkv.predictor.graphsage_forecaster",
    "GraphSageModel": "pbkv.predictor.graphsage",
    "TrainConfig": "pbkv.predictor.train",
    "fit_graphsage": "pbkv.predictor.train",
    "load_checkpoint": "pbkv.predictor.checkpoint",
    "save_checkpoint": "pbkv.predictor.checkpoint",
}


def __getattr__(name: str) -> Any:
    """Import the torch-backed names on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_MARKOV_ORDER",
    "END",
    "TRACE_VERSION",
    "CallGraph",
    "CheckpointError",
    "CheckpointInfo",
    "ForecastScores",
    "Forecast",
    "Forecaster",
    "GraphSageConfig",
    "GraphSageForecaster",
    "GraphSageModel",
    "MarkovForecaster",
    "NoiseForecaster",
    "OnlineAccuracy",
    "OnlineMarkovForecaster",
    "OracleForecaster",
    "SegmentCount",
    "TraceFileError",
    "TraceLineError",
    "TraceReadResult",
    "TraceRecord",
    "TextEncoder",
    "TraceStep",
    "TrainConfig",
    "UniformForecaster",
    "WorkflowState",
    "agent_weights",
    "fit_graphsage",
    "forecaster_names",
    "load_checkpoint",
    "make_forecaster",
    "make_text_encoder",
    "read_traces",
    "save_checkpoint",
    "score_forecaster",
    "split_records",
    "survival",
    "text_encoder_names",
    "top1_accuracy",
    "write_traces",
]
