"""Held-out scores of a forecaster: top-1 accuracy per step and END calibration (§6, §9).

Every prefix of every trace is scored, step ``t+k`` only while the trace is alive before
it, ties to the lower column; all prefixes go to the forecaster in large batches.
:func:`~pbkv.predictor.evaluation.top1_accuracy` is its top-1 part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pbkv.predictor.base import Forecaster, WorkflowState
from pbkv.predictor.features import IGNORE_LABEL, step_labels
from pbkv.predictor.trace import TraceRecord
from pbkv.predictor.vocab import agent_index, check_path


@dataclass(frozen=True, slots=True)
class ForecastScores:
    """Scores of one forecaster on held-out traces.

    Args:
        name: the forecaster's name.
        top1: accuracy at step ``k`` in entry ``k-1``, shape ``(K,)`` (nan: no pair).
        end_brier: mean ``(P[END] - 1{step is END})^2`` at step ``k``, shape ``(K,)``.
        pairs: scored (prefix, step) pairs at step ``k``, shape ``(K,)``.
    """

    name: str
    top1: np.ndarray
    end_brier: np.ndarray
    pairs: np.ndarray

    @property
    def mean_end_brier(self) -> float:
        """Brier score of END over all scored pairs of all steps."""
        total = float(self.pairs.sum())
        return float(np.nansum(self.end_brier * self.pairs) / total) if total else float("nan")


def score_forecaster(
    forecaster: Forecaster,
    records: Sequence[TraceRecord],
    *,
    horizon: int | None = None,
    batch_size: int = 1024,
) -> ForecastScores:
    """Score ``forecaster`` on every prefix of ``records``.

    Args:
        forecaster: the model under test.
        records: finished traces over its agents (empty ones are ignored); each trace's
            ``task_id`` is its ``workflow_id`` (for the oracle).
        horizon: steps scored, ``1..forecaster.horizon``; default all.
        batch_size: states per ``forecast`` call.

    Raises:
        ValueError: a bad ``horizon`` or ``batch_size``, or as ``forecaster.forecast``.
    """
    horizon = forecaster.horizon if horizon is None else horizon
    if not 1 <= horizon <= forecaster.horizon:
        raise ValueError(f"horizon must be 1 to {forecaster.horizon}, got {horizon}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    index = agent_index(forecaster.agents)
    states: list[WorkflowState] = []
    labels: list[np.ndarray] = []
    for record in records:
        path = record.agents
        if not path:
            continue
        check_path(index, path)
        states += [
            WorkflowState(
                record.task_id,
                record.app,
                path[:t],
                record.task_text,
                context_tail=record.steps[t - 1].context_tail,
            )
            for t in range(1, len(path) + 1)
        ]
        labels.append(step_labels(index, path, horizon))
    if not states:
        nan = np.full(horizon, np.nan)
        return ForecastScores(forecaster.name, nan, nan.copy(), np.zeros(horizon))
    forecast = np.concatenate(
        [
            np.asarray(forecaster.forecast(states[i : i + batch_size]))[:, :horizon]
            for i in range(0, len(states), batch_size)
        ]
    )
    return _scores(forecaster.name, forecast, np.concatenate(labels), len(forecaster.agents))


def _scores(name: str, forecast: np.ndarray, labels: np.ndarray, end: int) -> ForecastScores:
    """Score ``forecast (N, K, |V|+1)`` against ``labels (N, K)``."""
    scored = labels != IGNORE_LABEL
    pairs = scored.sum(axis=0).astype(np.float64)
    hits = (forecast.argmax(axis=-1) == labels) & scored
    brier = (forecast[..., end] - (labels == end)) ** 2 * scored
    with np.errstate(invalid="ignore", divide="ignore"):
        return ForecastScores(name, hits.sum(axis=0) / pairs, brier.sum(axis=0) / pairs, pairs)
