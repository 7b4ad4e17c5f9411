"""The predictor's command-line verbs as plain functions returning rich renderables.

``pbkv trace generate``, ``pbkv trace split``, ``pbkv train``, ``pbkv eval-predictor`` and
``pbkv bench-predictor`` call these with parsed arguments and print what they return.
Training draws a progress bar on the given console. Torch is imported only by the verbs
that need it.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pbkv.predictor.base import Forecaster, WorkflowState
from pbkv.predictor.callgraph import CallGraph
from pbkv.predictor.dataset import TextSource, split_records
from pbkv.predictor.scoring import ForecastScores, score_forecaster
from pbkv.predictor.trace import TraceRecord, read_traces, write_traces

log = logging.getLogger(__name__)

DEFAULT_TEXT_ENCODER = "smollm2"
PAPER_TOP1 = {"paper model": (0.935, 0.848, 0.771), "paper markov-1": (0.752, 0.555, 0.295)}
"""Top-1 accuracy at k = 1..3 the paper reports on its multi-hop workload."""

PathLike = str | os.PathLike[str]

if TYPE_CHECKING:
    from pbkv.predictor.train import TrainConfig


def trace_generate(app: str, workflows: int, seed: int, out: PathLike) -> Table:
    """Generate ``workflows`` workflows of ``app`` with ``seed`` and write their traces.

    Raises:
        ValueError: unknown app, or a negative count or seed.
    """
    from pbkv.examples import get_app

    records = [w.to_trace() for w in get_app(app).generate(workflows, seed)]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_traces(out, records)
    table = _trace_table(f"{app} traces (seed {seed})", {str(out): records})
    return table


def trace_split(
    traces: PathLike,
    train_out: PathLike,
    test_out: PathLike,
    *,
    test_fraction: float = 0.25,
    seed: int = 0,
    by_task: bool = True,
    strict: bool = False,
) -> Table:
    """Split a trace file into a training and a held-out file.

    With ``by_task`` (the default) the trials of one task (``task_id`` ``{task}-{trial}``,
    as in τ-bench) stay on one side.

    Raises:
        ValueError: two of the three paths name the same file, or the input holds no
            readable record (see :func:`read_records`).
    """
    _check_distinct({"the input": traces, "--train-out": train_out, "--test-out": test_out})
    records = read_records(traces, strict=strict)
    train, test = split_records(records, test_fraction, seed=seed, by_task=by_task)
    write_traces(train_out, train)
    write_traces(test_out, test)
    return _trace_table("split", {str(train_out): train, str(test_out): test})


def train(
    app: str,
    traces: PathLike,
    out: PathLike,
    *,
    epochs: int = 30,
    horizon: int = 3,
    text_encoder: str | None = DEFAULT_TEXT_ENCODER,
    text_source: str = "task",
    seed: int = 0,
    batch_size: int = 256,
    learning_rate: float = 2e-3,
    val_fraction: float = 0.1,
    members: int = 1,
    strict: bool = False,
    console: Console | None = None,
) -> Table:
    """Train a GraphSAGE forecaster for ``app`` on ``traces`` and write a checkpoint to ``out``.

    Args:
        app: the app whose call graph the model runs over.
        traces: training traces (JSONL); bad lines are skipped with a warning.
        out: checkpoint folder (``graphsage.safetensors`` + ``graphsage.json``).
        epochs / batch_size / learning_rate / val_fraction / seed: fit settings.
        members: models trained and averaged (a deep ensemble; see
            :class:`~pbkv.predictor.train.TrainConfig`).
        strict: refuse a traces file with any bad line.
        horizon: ``K``.
        text_encoder: text encoder name, or ``None`` to train without ``h_txt``.
        text_source: what the encoder embeds per state: ``task`` (the task text) or
            ``step`` (each step's ``context_tail``, else the task text); kept in the
            sidecar so the forecaster embeds the same way.
        console: where the progress bar is drawn (default: stderr).

    Returns:
        A summary table (traces, examples, parameters, best epoch, losses, seconds).

    Raises:
        ValueError: unknown app, encoder or text source, traces naming agents outside the
            app, or no usable trace (:func:`read_records`). Transitions the traces take
            that the app does not declare (between a fan-out's branches) join its graph.
    """
    from pbkv.examples import get_app
    from pbkv.predictor.dataset import TEXT_SOURCES

    spec = get_app(app)
    graph = CallGraph(spec.agents, spec.edges)
    if text_source not in TEXT_SOURCES:
        raise ValueError(f"text_source must be one of {TEXT_SOURCES}, got {text_source!r}")
    records = read_records(traces, strict=strict, with_steps=True)  # before importing torch
    graph = _widened(graph, records)
    console = console or Console(stderr=True)

    from pbkv.predictor.checkpoint import CheckpointInfo, save_checkpoint
    from pbkv.predictor.graphsage import GraphSageConfig
    from pbkv.predictor.graphsage_forecaster import text_inputs
    from pbkv.predictor.text import make_text_encoder
    from pbkv.predictor.train import EpochReport, TrainConfig, fit_graphsage

    inputs, encode_s = {}, 0.0
    if text_encoder:
        encoder = make_text_encoder(text_encoder)
        started = time.perf_counter()
        what = "task texts" if text_source == "task" else "step texts"
        with console.status(f"embedding {what} with {text_encoder} (cached per text)"):
            inputs = text_inputs(encoder, records, text_source)  # type: ignore[arg-type]
        encode_s = time.perf_counter() - started
    settings = TrainConfig(
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        val_fraction=val_fraction,
        seed=seed,
        members=members,
    )
    with _progress(console) as bar:
        task = bar.add_task("training graphsage", total=epochs * members, loss="")

        def on_epoch(report: EpochReport) -> None:
            loss = f"train {report.train_loss:.4f}  val {report.val_loss:.4f}"
            if report.members > 1:
                loss = f"member {report.member + 1}/{report.members}  {loss}"
            bar.update(task, completed=report.member * epochs + report.epoch, loss=loss)

        result = fit_graphsage(
            records,
            graph,
            config=GraphSageConfig(horizon=horizon),
            train=settings,
            **inputs,
            on_epoch=on_epoch,
        )
    best = result.history[result.best_epoch - 1]  # the first member's kept epoch
    facts = {
        "traces_file": str(Path(traces).resolve()),
        "traces": len(records),
        "examples": result.examples,
        "epochs": epochs,
        "best_epoch": result.best_epoch,
        "members": members,
        "best_epochs": list(result.best_epochs),
        # losses of the first member's kept epoch (on its own validation tasks)
        "train_loss" if members == 1 else "member1_train_loss": best.train_loss,
        "val_loss" if members == 1 else "member1_val_loss": best.val_loss,
        "fit_s": round(result.elapsed_s, 2),
        "text_embedding_s": round(encode_s, 2),
        "seed": seed,
    }
    info = CheckpointInfo(
        app,
        spec.agents,
        tuple(spec.edges),
        result.model.config,
        text_encoder,
        facts,
        text_source=text_source if text_encoder else "task",
    )
    save_checkpoint(out, result.model, info)
    table = Table(title=f"graphsage checkpoint {out}")
    table.add_column("field")
    table.add_column("value", justify="right")
    table.add_row("parameters", f"{result.model.parameter_count():,}")
    table.add_row("text encoder", text_encoder or "none")
    table.add_row("text source", info.text_source)
    for key, value in facts.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    return table


def eval_predictor(
    app: str,
    traces: PathLike,
    predictors: Sequence[str],
    *,
    train_traces: PathLike | None = None,
    checkpoint: PathLike | None = None,
    horizon: int = 3,
    markov_smoothing: float = 0.0,
    folds: int = 0,
    text_encoder: str | None = None,
    text_source: str = "task",
    seed: int = 0,
    epochs: int = 30,
    members: int = 1,
    json_path: PathLike | None = None,
    strict: bool = False,
    console: Console | None = None,
    command: str = "",
) -> Table:
    """Score predictors on held-out traces: top-1 accuracy at k = 1..K and END Brier score.

    Names are registry names plus ``graphsage-notext`` (the graphsage model with every
    text vector withheld). With ``folds`` >= 2, ``traces`` are all the traces and every
    predictor is cross-validated over their tasks
    (:func:`~pbkv.predictor.crossval.cross_validate`). Otherwise ``traces`` are held out:
    ``markov*`` fit on ``train_traces`` (default: the traces file named in the
    checkpoint's sidecar); ``graphsage`` loads ``checkpoint`` or, without one, trains on
    ``train_traces`` with ``text_encoder``/``text_source``; ``oracle`` reads the
    held-out paths.

    Args:
        seed: deals tasks into folds, and seeds a graphsage trained here.
        epochs / members: training epochs and ensemble members of a graphsage trained
            here.
        json_path: also write the scores (and per-fold scores) to this JSON file.
        strict: refuse a traces file with any bad line.
        command: the command line recorded in that file.
        console: where the cross-validation progress bar is drawn (default: stderr).

    Returns:
        One row per predictor (plus the paper's reference rows when ``K >= 3``).

    Raises:
        ValueError: an unknown app, predictor, text encoder or text source, a predictor
            that lacks an input, ``graphsage-notext`` for a model trained here without
            text, or ``folds`` combined with a checkpoint or training traces.
    """
    from pbkv.examples import get_app
    from pbkv.predictor.crossval import check_predictor_names, cross_validate, predictor_builder
    from pbkv.predictor.dataset import TEXT_SOURCES
    from pbkv.predictor.text import text_encoder_names

    if text_source not in TEXT_SOURCES:
        raise ValueError(f"text_source must be one of {TEXT_SOURCES}, got {text_source!r}")
    if text_encoder is not None and text_encoder not in text_encoder_names():
        known = ", ".join(text_encoder_names())
        raise ValueError(f"unknown text encoder {text_encoder!r}; known text encoders: {known}")
    check_predictor_names(predictors)
    if "graphsage-notext" in predictors and checkpoint is None and text_encoder is None:
        raise ValueError(
            "graphsage-notext withholds the text, but a graphsage trained here without a "
            "text encoder has none: it would equal graphsage; name a text encoder"
        )
    source: TextSource = "step" if text_source == "step" else "task"
    spec = get_app(app)
    records = read_records(traces, strict=strict, with_steps=True)
    graph = _widened(CallGraph(spec.agents, spec.edges), records)
    train = _train_config(seed, epochs, members)
    fold_rows: list[dict[str, object]] = []
    if folds:
        if checkpoint is not None or train_traces is not None:
            raise ValueError(
                "cross-validation (folds) trains on the traces themselves; "
                "drop the checkpoint and training traces"
            )
        console = console or Console(stderr=True)
        with _progress(console, transient=True) as bar:
            task = bar.add_task(f"{folds}-fold cross-validation", total=folds, loss="")
            result = cross_validate(
                records,
                graph,
                predictors,
                folds=folds,
                seed=seed,
                horizon=horizon,
                text_encoder=text_encoder,
                text_source=source,
                train=train,
                smoothing=markov_smoothing,
                on_fold=lambda n: bar.update(task, completed=n),
            )
        scores = list(result.pooled)
        fold_rows = [
            {"fold": n, "traces": size, "scores": [_score_dict(s) for s in fold]}
            for n, (size, fold) in enumerate(zip(result.fold_traces, result.folds, strict=True), 1)
        ]
        title = f"{app}: {folds}-fold cross-validation by task over {len(records)} traces"
    else:
        build = predictor_builder(
            graph,
            horizon,
            _training_traces(train_traces, checkpoint, strict),
            records,
            checkpoint=checkpoint,
            text_encoder=text_encoder,
            text_source=source,
            train=train,
            smoothing=markov_smoothing,
        )
        scores = [score_forecaster(build(name), records, horizon=horizon) for name in predictors]
        title = f"{app}: {len(records)} held-out traces"
    if json_path is not None:
        learned = any(name.startswith("graphsage") for name in predictors)
        if checkpoint is not None:
            config = _sidecar(checkpoint).get("config")
            members = config.get("members", 1) if isinstance(config, dict) else 1
        document = {
            "command": command,
            "app": app,
            "graphsage_members": members if learned else None,
            "scores": [_score_dict(s) for s in scores],
            "folds": fold_rows,
        }
        _write_json(json_path, document)
    return scores_table(scores, title=title, paper=horizon >= 3)


def _train_config(seed: int, epochs: int, members: int) -> TrainConfig:
    from pbkv.predictor.train import TrainConfig

    return TrainConfig(seed=seed, epochs=epochs, members=members)


def _score_dict(score: ForecastScores) -> dict[str, object]:
    """JSON-ready scores; a step with no scored pair is ``null`` (strict JSON has no NaN)."""

    def values(array: np.ndarray) -> list[float | None]:
        return [None if np.isnan(v) else float(v) for v in array]

    return {
        "predictor": score.name,
        "top1": values(score.top1),
        "end_brier": values(score.end_brier),
        "pairs": [int(v) for v in score.pairs],
    }


def _write_json(path: PathLike, document: Mapping[str, object]) -> None:
    import json

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document, indent=1) + "\n")


def scores_table(scores: Sequence[ForecastScores], *, title: str, paper: bool = False) -> Table:
    """Render scores as a table: top-1 at each step, END Brier per step and overall."""
    horizon = len(scores[0].top1) if scores else 0
    table = Table(title=title)
    table.add_column("predictor")
    for k in range(1, horizon + 1):
        table.add_column(f"top-1 k={k}", justify="right")
    for k in range(1, horizon + 1):
        table.add_column(f"END Brier k={k}", justify="right")
    table.add_column("END Brier", justify="right")
    for s in scores:
        table.add_row(
            s.name,
            *(f"{v:.3f}" for v in s.top1),
            *(f"{v:.4f}" for v in s.end_brier),
            f"{s.mean_end_brier:.4f}",
        )
    if paper:
        for name, top1 in PAPER_TOP1.items():
            cells = [f"{v:.3f}" for v in top1] + ["-"] * (horizon - 3)
            table.add_row(f"[dim]{name}[/dim]", *cells, *["-"] * (horizon + 1))
    return table


def bench_predictor(
    checkpoint: PathLike,
    *,
    batch: int = 1024,
    repeats: int = 20,
    threads: int | None = None,
    traces: PathLike | None = None,
    json_path: PathLike | None = None,
    command: str = "",
    strict: bool = False,
) -> Table:
    """Time one ``forecast`` call on ``batch`` workflow states (CPU), after a warm-up.

    States are prefixes of ``traces`` (default: the checkpoint's training traces), cycled
    to fill the batch; each carries a random text vector when the model takes one, so
    no text encoder runs inside the timing.

    Args:
        json_path: also write the timing, the checkpoint's sidecar (sizes and training
            facts) and the parameter count to this JSON file.
        command: the command line recorded in that file.
        strict: refuse a traces file with any bad line.

    Returns:
        Median, p10 and p90 latency in milliseconds, the per-state cost, and the median
        CPU time of this process per call (on a shared machine the wall time also holds
        the time other processes had the core).
    """
    import torch

    from pbkv.predictor.graphsage_forecaster import GraphSageForecaster

    if threads is not None:
        torch.set_num_threads(threads)
    forecaster = GraphSageForecaster.from_checkpoint(checkpoint, text_encoder=None)
    states = _bench_states(forecaster, checkpoint, traces, batch, strict)
    forecaster.forecast(states)
    times_ms, cpu_ms = [], []
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        forecaster.forecast(states)
        times_ms.append(1000 * (time.perf_counter() - started))
        cpu_ms.append(1000 * (time.process_time() - started_cpu))
    table = Table(
        title=f"graphsage forecast latency, batch {batch}, {torch.get_num_threads()} threads"
    )
    for column in ("median ms", "p10 ms", "p90 ms", "µs / state", "median cpu ms"):
        table.add_column(column, justify="right")
    p10, p50, p90 = np.percentile(times_ms, [10, 50, 90])
    cpu = float(np.median(cpu_ms))
    table.add_row(
        f"{p50:.2f}", f"{p10:.2f}", f"{p90:.2f}", f"{1000 * p50 / batch:.2f}", f"{cpu:.2f}"
    )
    if json_path is not None:
        document = {
            "command": command,
            "batch": batch,
            "threads": torch.get_num_threads(),
            "median_ms": float(p50),
            "p10_ms": float(p10),
            "p90_ms": float(p90),
            "median_cpu_ms": cpu,
            "parameters": forecaster.model.parameter_count(),
            "checkpoint": _sidecar(checkpoint),
        }
        _write_json(json_path, document)
    return table


def _bench_states(
    forecaster: Forecaster, checkpoint: PathLike, traces: PathLike | None, batch: int, strict: bool
) -> list[WorkflowState]:
    records = read_records(traces or _sidecar_traces(checkpoint), strict=strict, with_steps=True)
    prefixes = [(r, r.agents[:t]) for r in records for t in range(1, len(r.steps) + 1)]
    if not prefixes:
        raise ValueError("no trace has a step to build states from")
    text_dim = forecaster.model.config.text_dim  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    states = []
    for i in range(batch):
        record, path = prefixes[i % len(prefixes)]
        hidden = rng.standard_normal(text_dim).astype(np.float32) if text_dim else None
        states.append(WorkflowState(f"bench-{i}", record.app, path, record.task_text, hidden))
    return states


def _training_traces(
    train_traces: PathLike | None, checkpoint: PathLike | None, strict: bool
) -> list[TraceRecord]:
    if train_traces is not None:
        return read_records(train_traces, strict=strict, with_steps=True)
    if checkpoint is not None:
        return read_records(_sidecar_traces(checkpoint), strict=strict, with_steps=True)
    return []


def _sidecar(checkpoint: PathLike) -> dict[str, object]:
    import json

    from pbkv.predictor.checkpoint import SIDECAR_FILE

    folder = Path(checkpoint)
    document: dict[str, object] = json.loads(
        ((folder if folder.is_dir() else folder.parent) / SIDECAR_FILE).read_text()
    )
    return document


def _sidecar_traces(checkpoint: PathLike) -> str:
    training = _sidecar(checkpoint).get("training", {})
    path = training.get("traces_file") if isinstance(training, dict) else None
    if not path:
        raise ValueError(f"checkpoint {checkpoint} names no training traces; pass train_traces=")
    return str(path)


def read_records(
    path: PathLike, *, strict: bool = False, with_steps: bool = False
) -> list[TraceRecord]:
    """Return the good records of a trace file, refusing one that has none.

    Args:
        strict: refuse the file at its first bad line.
        with_steps: keep only records with at least one step (what models learn from).

    Raises:
        ValueError: no record is left (an empty file, every line bad, or no steps); the
            message names the file and the first bad line. ``TraceFileError`` when
            ``strict`` and a line is bad.
        OSError: the file cannot be read.
    """
    result = read_traces(path, strict=strict)
    records = [r for r in result.records if r.steps] if with_steps else result.records
    if records:
        return records
    if result.errors:
        why = f"all {len(result.errors)} lines are bad (the first: {result.errors[0]})"
    elif result.records:
        why = "no record has a step"
    else:
        why = "the file is empty"
    raise ValueError(f"{path}: no trace records to use: {why}")


def _check_distinct(paths: Mapping[str, PathLike]) -> None:
    """Raise ``ValueError`` if two of ``paths`` name the same file (an output would
    overwrite the input or the other output)."""
    seen: dict[Path, str] = {}
    for label, path in paths.items():
        resolved = Path(path).resolve()
        if resolved in seen:
            raise ValueError(f"{label} and {seen[resolved]} are the same file ({path})")
        seen[resolved] = label


def _trace_table(title: str, files: dict[str, list[TraceRecord]]) -> Table:
    table = Table(title=title)
    for column in ("file", "workflows", "steps", "mean steps", "max steps", "end reasons"):
        table.add_column(column, justify="left" if column in ("file", "end reasons") else "right")
    for path, records in files.items():
        lengths = [len(r.steps) for r in records] or [0]
        reasons = Counter(r.end_reason for r in records)
        table.add_row(
            path,
            str(len(records)),
            str(sum(lengths)),
            f"{statistics.fmean(lengths):.2f}",
            str(max(lengths)),
            ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())),
        )
    return table


def _progress(console: Console, *, transient: bool = False) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[loss]}"),
        console=console,
        transient=transient,
    )


def _widened(graph: CallGraph, records: Sequence[TraceRecord]) -> CallGraph:
    """The app's call graph plus the transitions its traces take between concurrent
    fan-out branches (:meth:`CallGraph.widened`), logged when there are any."""
    widened, added = graph.widened(records)
    if added:
        log.info("call graph: %d transitions of the traces added to the app's edges", added)
    return widened
