"""Fit a GraphSAGE forecaster on traces (§6): cross-entropy per step, best epoch kept.

Plain synchronous code. Progress is reported through an ``on_epoch`` callback (the CLI
draws a progress bar with it).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from pbkv.predictor.callgraph import CallGraph
from pbkv.predictor.dataset import Examples, build_examples, task_group
from pbkv.predictor.features import agent_statistics, reachability_masks, successor_edges
from pbkv.predictor.graphsage import (
    AnyGraphSage,
    GraphSageBatch,
    GraphSageConfig,
    GraphSageEnsemble,
    GraphSageModel,
)
from pbkv.predictor.trace import TraceRecord


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """How to fit.

    Args:
        epochs: passes over the training examples.
        batch_size: examples per optimiser step.
        learning_rate: AdamW's peak rate (cosine-annealed to 5% of it).
        weight_decay: AdamW's decoupled weight decay.
        text_dropout: probability of hiding an example's text vector, so the model also
            works when a state comes without one.
        val_fraction: share of tasks (:func:`~pbkv.predictor.dataset.task_group`) held
            out to choose the best epoch; 0 keeps the last.
        members: models fitted (member ``i`` with seed ``seed + i``) and averaged as a
            deep ensemble; sets the model's ``config.members``.
        seed: initialisation, shuffling and split seed.
        threads: torch intra-op threads during the fit (restored after). One is the
            default: the model is small, and on a shared 2-core machine more threads
            spin against other processes and run many times slower.
    """

    epochs: int = 30
    batch_size: int = 256
    learning_rate: float = 2e-3
    weight_decay: float = 0.05
    text_dropout: float = 0.3
    val_fraction: float = 0.1
    members: int = 1
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        if min(self.epochs, self.batch_size, self.threads, self.members) < 1:
            raise ValueError("epochs, batch_size, threads and members must be >= 1")
        if not 0.0 <= self.text_dropout <= 1.0:
            raise ValueError(f"text_dropout must be in [0, 1], got {self.text_dropout}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")


@dataclass(frozen=True, slots=True)
class EpochReport:
    """One epoch's losses (mean cross-entropy per labelled step); ``val_loss`` is nan
    without a validation split. ``member`` is the 0-based ensemble member being fitted
    (of ``members``)."""

    epoch: int
    epochs: int
    train_loss: float
    val_loss: float
    elapsed_s: float
    member: int = 0
    members: int = 1


@dataclass(frozen=True, slots=True)
class TrainResult:
    """A fitted model and how it got there.

    Args:
        model: the weights of the best epoch (lowest validation loss, else the last), in
            eval mode; with ``config.members > 1`` an ensemble of such members.
        history: one report per epoch (of every member, in order).
        best_epoch: 1-based epoch whose weights were kept (of the first member).
        examples: training examples (prefixes) used, validation excluded (first member).
        elapsed_s: wall time of the fit, features and text vectors excluded.
        best_epochs: the kept epoch of every member.
    """

    model: AnyGraphSage
    history: tuple[EpochReport, ...]
    best_epoch: int
    examples: int
    elapsed_s: float
    best_epochs: tuple[int, ...] = ()


def build_model(
    graph: CallGraph, records: Sequence[TraceRecord], config: GraphSageConfig
) -> GraphSageModel:
    """Return an untrained model (one member) over ``graph`` with statistics from
    ``records``."""
    return GraphSageModel(
        replace(config, members=1),
        successor_edges(graph),
        agent_statistics(graph, records),
        reachability_masks(graph, config.horizon),
    )


def fit_graphsage(
    records: Sequence[TraceRecord],
    graph: CallGraph,
    *,
    config: GraphSageConfig = GraphSageConfig(),  # noqa: B008 - frozen, never mutated
    train: TrainConfig = TrainConfig(),  # noqa: B008 - frozen, never mutated
    text_vectors: np.ndarray | None = None,
    example_text_vectors: np.ndarray | None = None,
    example_has_text: np.ndarray | None = None,
    on_epoch: Callable[[EpochReport], None] | None = None,
) -> TrainResult:
    """Train a GraphSAGE forecaster on ``records``.

    Args:
        records: finished workflows over ``graph``'s agents.
        graph: the app's call graph (its agent order is the column order).
        config: model sizes; ``text_dim`` is set from ``text_vectors`` and ``members``
            from ``train``.
        train: optimiser settings.
        text_vectors: one task-text vector per record, shape ``(len(records), D)``, or
            ``None`` to train without ``h_txt``.
        example_text_vectors: instead, one vector per step of every record, in order
            (per-step text; see :func:`~pbkv.predictor.dataset.example_texts`).
        example_has_text: with ``example_text_vectors``, which steps have a text.
        on_epoch: called after every epoch.

    Raises:
        ValueError: no trace has a step, a trace leaves the graph, or ``text_vectors``
            has the wrong number of rows.
    """
    for record in records:
        if record.steps:
            graph.validate_path(record.agents)
    vectors = text_vectors if example_text_vectors is None else example_text_vectors
    text_dim = 0 if vectors is None else int(vectors.shape[1])
    config = replace(config, text_dim=text_dim, members=train.members)
    examples = build_examples(
        records,
        graph.agents,
        horizon=config.horizon,
        max_prefix=config.max_prefix,
        max_positions=config.max_positions,
        text_vectors=text_vectors,
        example_text_vectors=example_text_vectors,
        example_has_text=example_has_text,
    )
    if len(examples) == 0:
        raise ValueError("no trace has a step to learn from")
    tasks = np.asarray([task_group(r) for r in records])[examples.trace]
    threads = torch.get_num_threads()
    torch.set_num_threads(train.threads)
    results, models = [], []
    try:
        for member in range(config.members):
            seed = train.seed + member  # members differ in init, shuffling and val split
            torch.manual_seed(seed)
            rng = np.random.default_rng(seed)
            model = build_model(graph, records, config)
            fit_rows, val_rows = _split(tasks, train.val_fraction, rng)
            report = on_epoch
            if on_epoch is not None and config.members > 1:
                report = _tag_member(on_epoch, member, config.members)
            results.append(_fit(model, examples, fit_rows, val_rows, train, rng, report))
            models.append(model)  # _fit left the member's best weights in it
    finally:
        torch.set_num_threads(threads)
    if len(results) == 1:
        return replace(results[0], best_epochs=(results[0].best_epoch,))
    first = results[0]
    return TrainResult(
        GraphSageEnsemble(models).eval(),
        tuple(h for r in results for h in r.history),
        first.best_epoch,
        first.examples,
        sum(r.elapsed_s for r in results),
        tuple(r.best_epoch for r in results),
    )


def _tag_member(
    on_epoch: Callable[[EpochReport], None], member: int, members: int
) -> Callable[[EpochReport], None]:
    return lambda report: on_epoch(replace(report, member=member, members=members))


def _split(
    tasks: np.ndarray, val_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Hold out whole tasks: return (train rows, validation rows) of the examples whose
    tasks are ``tasks`` (one per example).

    Trials of one task (τ-bench replays each task several times) share their text and
    much of their path, so a validation trace whose sibling is trained on scores an
    overfitted epoch as the best one.
    """
    groups = np.unique(tasks)
    n_val = int(val_fraction * len(groups))
    if n_val == 0 or n_val == len(groups):
        return np.arange(len(tasks)), np.zeros(0, dtype=np.int64)
    held = rng.permutation(groups)[:n_val]
    is_val = np.isin(tasks, held)
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def _fit(
    model: GraphSageModel,
    examples: Examples,
    fit_rows: np.ndarray,
    val_rows: np.ndarray,
    train: TrainConfig,
    rng: np.random.Generator,
    on_epoch: Callable[[EpochReport], None] | None,
) -> TrainResult:
    started = time.perf_counter()
    batch = GraphSageBatch.from_arrays(examples.paths, examples.text, examples.has_text)
    labels = torch.from_numpy(examples.labels)
    optimiser = torch.optim.AdamW(
        model.parameters(), lr=train.learning_rate, weight_decay=train.weight_decay
    )
    steps_per_epoch = math.ceil(len(fit_rows) / train.batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimiser, T_max=train.epochs * steps_per_epoch, eta_min=0.05 * train.learning_rate
    )
    history: list[EpochReport] = []
    best = (math.inf, 0, copy.deepcopy(model.state_dict()))
    for epoch in range(1, train.epochs + 1):
        model.train()
        losses = []
        for chunk in np.array_split(rng.permutation(fit_rows), steps_per_epoch):
            rows = torch.from_numpy(chunk)
            part = _drop_text(batch.select(rows), train.text_dropout, rng)
            loss = model.loss(part, labels[rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
            losses.append(loss.item() * len(chunk))
        val_loss = _evaluate_loss(model, batch, labels, val_rows)
        report = EpochReport(
            epoch,
            train.epochs,
            sum(losses) / len(fit_rows),
            val_loss,
            time.perf_counter() - started,
        )
        history.append(report)
        if on_epoch is not None:
            on_epoch(report)
        score = val_loss if len(val_rows) else -epoch
        if score <= best[0]:
            best = (score, epoch, copy.deepcopy(model.state_dict()))
    model.load_state_dict(best[2])
    model.eval()
    elapsed = time.perf_counter() - started
    return TrainResult(model, tuple(history), best[1], len(fit_rows), elapsed)


def _drop_text(batch: GraphSageBatch, p: float, rng: np.random.Generator) -> GraphSageBatch:
    if p <= 0 or batch.text.shape[1] == 0:
        return batch
    keep = torch.from_numpy(rng.random(len(batch.has_text)) >= p)
    return batch._replace(has_text=batch.has_text & keep)


def _evaluate_loss(
    model: GraphSageModel, batch: GraphSageBatch, labels: torch.Tensor, rows: np.ndarray
) -> float:
    if len(rows) == 0:
        return math.nan
    model.eval()
    index = torch.from_numpy(rows)
    with torch.inference_mode():
        return float(model.loss(batch.select(index), labels[index]))
