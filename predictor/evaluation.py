"""Forecast accuracy on held-out traces (§6)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pbkv.predictor.base import Forecaster
from pbkv.predictor.scoring import score_forecaster
from pbkv.predictor.trace import TraceRecord


def top1_accuracy(
    forecaster: Forecaster, records: Iterable[TraceRecord], horizon: int | None = None
) -> np.ndarray:
    """Return how often each forecast step's most likely column is the true one.

    For every trace and every prefix length ``t`` (the prefix's last agent is current),
    step ``t+k`` is predicted from the prefix; its label is the ``(t+k)``-th agent, or
    ``END`` for the step right after the last agent. As forecasts are conditional on
    being alive before each step, a pair counts only while the trace is alive before
    step ``t+k`` (steps after the first ``END`` are not scored). Ties go to the lower
    column. Each trace's ``task_id`` is its ``workflow_id`` (for the oracle).

    Args:
        forecaster: the model under test.
        records: traces over the forecaster's agents; empty traces are ignored.
        horizon: steps scored, ``1..forecaster.horizon``; default all of them.

    Returns:
        float64 array, shape ``(horizon,)``: accuracy at step ``k`` in entry ``k-1``,
        ``nan`` where no pair was scored.

    Raises:
        ValueError: a bad ``horizon``, or as ``forecaster.forecast``.
    """
    return score_forecaster(forecaster, list(records), horizon=horizon).top1
