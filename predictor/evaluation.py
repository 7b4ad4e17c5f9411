"""Forecast accuracy on held-out traces (§6)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pbkv.predictor.base import Forecaster, WorkflowState
from pbkv.predictor.trace import END, TraceRecord
from pbkv.predictor.vocab import agent_index, check_path


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
    horizon = forecaster.horizon if horizon is None else horizon
    if not 1 <= horizon <= forecaster.horizon:
        raise ValueError(f"horizon must be 1 to {forecaster.horizon}, got {horizon}")
    columns = agent_index(forecaster.agents)
    hits = np.zeros(horizon)
    scored = np.zeros(horizon)
    for record in records:
        path = record.agents
        if not path:
            continue
        check_path(columns, path)
        states = [
            WorkflowState(
                record.task_id,
                record.app,
                path[:t],
                record.task_text,
                context_tail=record.steps[t - 1].context_tail,
            )
            for t in range(1, len(path) + 1)
        ]
        predicted = forecaster.forecast(states)[:, :horizon].argmax(axis=-1)
        labels = [columns[a] for a in path] + [columns[END]]
        for t in range(1, len(path) + 1):
            for k in range(min(horizon, len(path) + 1 - t)):
                scored[k] += 1
                hits[k] += predicted[t - 1, k] == labels[t + k]
    with np.errstate(invalid="ignore"):
        return hits / scored
