"""Forecasters of which agents a workflow runs next (§6).

Every forecaster returns, per workflow, a ``(K, |V|+1)`` array whose row ``k-1`` is the
distribution of step ``t+k`` given the workflow is alive before it (``END`` last); see
:mod:`pbkv.predictor.base`.
"""

from pbkv.predictor.base import Forecaster, WorkflowState
from pbkv.predictor.callgraph import CallGraph
from pbkv.predictor.evaluation import top1_accuracy
from pbkv.predictor.markov import MarkovForecaster
from pbkv.predictor.noise import NoiseForecaster
from pbkv.predictor.oracle import OracleForecaster
from pbkv.predictor.registry import DEFAULT_MARKOV_ORDER, forecaster_names, make_forecaster
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

__all__ = [
    "DEFAULT_MARKOV_ORDER",
    "END",
    "TRACE_VERSION",
    "CallGraph",
    "Forecaster",
    "MarkovForecaster",
    "NoiseForecaster",
    "OracleForecaster",
    "SegmentCount",
    "TraceFileError",
    "TraceLineError",
    "TraceReadResult",
    "TraceRecord",
    "TraceStep",
    "UniformForecaster",
    "WorkflowState",
    "agent_weights",
    "forecaster_names",
    "make_forecaster",
    "read_traces",
    "survival",
    "top1_accuracy",
    "write_traces",
]
