"""Cross-validated forecast accuracy, folds by task (§6, §9).

A held-out split of a small trace set (τ-bench has 200 real episodes over 50 tasks) is
noisy: which tasks land in the test part moves top-1 by a few points. Cross-validation
scores every trace once, by a model that never saw its task: the tasks are dealt into
``F`` folds, every predictor is fitted on ``F-1`` of them and scored on the last, and the
hits and scored pairs of all folds are summed.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pbkv.predictor.base import Forecaster
from pbkv.predictor.callgraph import CallGraph
from pbkv.predictor.dataset import TextSource, task_folds
from pbkv.predictor.registry import forecaster_names, make_forecaster
from pbkv.predictor.scoring import ForecastScores, score_forecaster
from pbkv.predictor.trace import TraceRecord

if TYPE_CHECKING:
    from pbkv.predictor.graphsage_forecaster import GraphSageForecaster
    from pbkv.predictor.train import TrainConfig

LEARNED = ("graphsage", "graphsage-notext")
"""Predictor names trained per fold: the model, and the same model with text withheld."""


def check_predictor_names(names: Sequence[str]) -> None:
    """Fail before any fitting on a name no predictor has.

    Raises:
        ValueError: no names, or an unknown one (the message lists the known ones).
    """
    if not names:
        raise ValueError("no predictors given")
    known = (*forecaster_names(), *LEARNED[1:])
    for name in names:
        if name not in known:
            raise ValueError(f"unknown predictor {name!r}; known: {', '.join(sorted(known))}")


def pool_scores(scores: Sequence[ForecastScores]) -> ForecastScores:
    """Sum the pairs of several scores of one predictor (one per fold).

    Raises:
        ValueError: no scores, or scores of different predictors or horizons.
    """
    if not scores:
        raise ValueError("nothing to pool")
    names = {s.name for s in scores}
    if len(names) != 1 or len({len(s.top1) for s in scores}) != 1:
        raise ValueError(f"can only pool scores of one predictor and horizon, got {names}")
    pairs = np.sum([s.pairs for s in scores], axis=0)
    hits = np.sum([np.nan_to_num(s.top1) * s.pairs for s in scores], axis=0)
    brier = np.sum([np.nan_to_num(s.end_brier) * s.pairs for s in scores], axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return ForecastScores(scores[0].name, hits / pairs, brier / pairs, pairs)


@dataclass(frozen=True, slots=True)
class CrossValidation:
    """Scores of every predictor, per fold and pooled.

    Args:
        pooled: one pooled score per predictor, in the order asked.
        folds: per fold, one score per predictor in the same order.
        fold_traces: held-out traces per fold.
    """

    pooled: tuple[ForecastScores, ...]
    folds: tuple[tuple[ForecastScores, ...], ...]
    fold_traces: tuple[int, ...]

    def wins(self, name: str, baseline: str) -> tuple[np.ndarray, np.ndarray]:
        """Return, per step ``k``, in how many folds ``name``'s top-1 beats ``baseline``'s,
        and in how many folds step ``k`` was scored at all.

        Raises:
            ValueError: a name that was not scored.
        """
        names = [s.name for s in self.pooled]
        a, b = names.index(name), names.index(baseline)
        beats = np.sum([fold[a].top1 > fold[b].top1 for fold in self.folds], axis=0)
        scored = np.sum([fold[a].pairs > 0 for fold in self.folds], axis=0)
        return beats, scored


def cross_validate(
    records: Sequence[TraceRecord],
    graph: CallGraph,
    predictors: Sequence[str],
    *,
    folds: int = 5,
    seed: int = 0,
    horizon: int = 3,
    text_encoder: str | None = None,
    text_source: TextSource = "task",
    train: TrainConfig | None = None,
    smoothing: float = 0.0,
    on_fold: Callable[[int], None] | None = None,
) -> CrossValidation:
    """Score ``predictors`` by ``folds``-fold cross-validation over the tasks of ``records``.

    Every predictor of a fold is fitted on that fold's training part only: ``markov*`` on
    its traces, ``graphsage`` trained there (one model per fold, which
    ``graphsage-notext`` reuses with every text vector withheld). ``oracle`` reads the
    held-out paths.

    Args:
        records: finished traces over ``graph``'s agents.
        graph: the app's call graph.
        predictors: registry names, plus ``graphsage-notext``.
        folds / seed: how many folds, and the seed that deals tasks into them (the
            graphsage fit uses ``train.seed``).
        horizon: ``K``.
        text_encoder / text_source: graphsage's text input (``None``: none).
        train: graphsage's fit settings (default :class:`~pbkv.predictor.train.TrainConfig`).
        smoothing: ``markov*``'s additive pseudo-count.
        on_fold: called with the 1-based fold number after each fold.

    Raises:
        ValueError: as :func:`check_predictor_names`, :func:`~pbkv.predictor.dataset.task_folds`
            or :func:`~pbkv.predictor.registry.make_forecaster`.
    """
    check_predictor_names(predictors)
    records = [r for r in records if r.steps]
    per_fold: list[tuple[ForecastScores, ...]] = []
    sizes = []
    for number, (fit_on, held_out) in enumerate(task_folds(records, folds, seed=seed), 1):
        build = predictor_builder(
            graph,
            horizon,
            fit_on,
            held_out,
            text_encoder=text_encoder,
            text_source=text_source,
            train=train,
            smoothing=smoothing,
        )
        scores = [score_forecaster(build(name), held_out, horizon=horizon) for name in predictors]
        per_fold.append(tuple(scores))
        sizes.append(len(held_out))
        if on_fold is not None:
            on_fold(number)
    pooled = tuple(pool_scores([fold[i] for fold in per_fold]) for i in range(len(predictors)))
    return CrossValidation(pooled, tuple(per_fold), tuple(sizes))


def predictor_builder(
    graph: CallGraph,
    horizon: int,
    fit_on: Sequence[TraceRecord],
    held_out: Sequence[TraceRecord],
    *,
    checkpoint: str | os.PathLike[str] | None = None,
    text_encoder: str | None = None,
    text_source: TextSource = "task",
    train: TrainConfig | None = None,
    smoothing: float = 0.0,
) -> Callable[[str], Forecaster]:
    """Return ``build(name)``, which makes the forecaster to score on ``held_out``.

    ``markov*`` fit on ``fit_on``; ``oracle`` reads ``held_out``'s paths; ``graphsage``
    loads ``checkpoint`` or, without one, is trained on ``fit_on`` once, and
    ``graphsage-notext`` is that same model with every text vector withheld.

    Raises:
        ValueError: (from ``build``) as :func:`~pbkv.predictor.registry.make_forecaster`.
    """
    learned: list[GraphSageForecaster] = []

    def build(name: str) -> Forecaster:
        if name not in LEARNED:
            return make_forecaster(
                name,
                agents=graph.agents,
                horizon=horizon,
                traces=fit_on,
                workflows={r.task_id: r.agents for r in held_out},
                graph=graph,
                smoothing=smoothing,
            )
        from pbkv.predictor.graphsage_forecaster import build_graphsage

        if checkpoint is None and not fit_on:
            raise ValueError(f"predictor {name!r} needs a checkpoint or training traces")
        if not learned:
            learned.append(
                build_graphsage(
                    graph.agents,
                    horizon=horizon,
                    traces=fit_on,
                    graph=graph,
                    checkpoint=checkpoint,
                    text_encoder=None if checkpoint else text_encoder,  # a checkpoint's own
                    text_source=text_source,
                    **({} if train is None else {"train": train}),
                )
            )
        view = copy.copy(learned[0])  # shares the model; only the text switch differs
        view.use_text = name == "graphsage" and view.model.config.text_dim > 0
        view.name = name
        return view

    return build
