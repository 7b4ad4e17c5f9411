"""Traces → supervised examples for the GraphSAGE forecaster (§6).

Every prefix of every trace is one example: its encoded path, its text vector and its
``K`` conditional labels (:func:`~pbkv.predictor.features.step_labels`). The text of a
prefix is chosen by :func:`state_text`: with the ``task`` source always the task text;
with the ``step`` source the current step's ``context_tail`` when the trace has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from pbkv.predictor.features import EncodedPaths, encode_paths, step_labels
from pbkv.predictor.trace import TraceRecord
from pbkv.predictor.vocab import agent_index

if TYPE_CHECKING:
    from pbkv.predictor.text import TextEncoder

TextSource = Literal["task", "step"]
"""Where a state's text comes from: the task text only, or the current step's context
tail (falling back to the task text)."""
TEXT_SOURCES: tuple[TextSource, ...] = ("task", "step")


def state_text(task_text: str, context_tail: str, source: TextSource) -> str:
    """Return the text embedded for one workflow state (``""``: none, ``h_txt`` = 0).

    Args:
        task_text: the workflow's task text.
        context_tail: the current step's latest message(s), or ``""``.
        source: ``step`` prefers ``context_tail``; ``task`` ignores it.

    Raises:
        ValueError: an unknown ``source``.
    """
    if source not in TEXT_SOURCES:
        raise ValueError(f"text source must be one of {TEXT_SOURCES}, got {source!r}")
    return context_tail if source == "step" and context_tail else task_text


def example_texts(records: Sequence[TraceRecord], source: TextSource) -> list[str]:
    """Return the text of every example :func:`build_examples` makes, in its order."""
    return [
        state_text(record.task_text, step.context_tail, source)
        for record in records
        for step in record.steps
    ]


@dataclass(frozen=True, slots=True)
class Examples:
    """Training examples, one per (trace, prefix).

    Args:
        paths: the encoded prefixes, batch ``N``.
        labels: int64, shape ``(N, K)``; ``IGNORE_LABEL`` past a workflow's end.
        text: float32, shape ``(N, D)`` (``D`` may be 0).
        has_text: bool, shape ``(N,)``.
        trace: which input trace each example comes from, int64, shape ``(N,)``.
    """

    paths: EncodedPaths
    labels: np.ndarray
    text: np.ndarray
    has_text: np.ndarray
    trace: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def embed_texts(encoder: TextEncoder, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Embed ``texts``, each distinct non-empty text once; ``""`` gets zeros.

    Returns:
        ``(vectors (N, D) float32, present (N,) bool)``.
    """
    unique = list(dict.fromkeys(t for t in texts if t))
    vectors = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    present = np.array([bool(t) for t in texts], dtype=bool)
    if unique:
        table = dict(zip(unique, encoder.encode(unique), strict=True))
        for row, text in enumerate(texts):
            if text:
                vectors[row] = table[text]
    return vectors, present


def build_examples(
    records: Sequence[TraceRecord],
    agents: Sequence[str],
    *,
    horizon: int,
    max_prefix: int,
    max_positions: int,
    text_vectors: np.ndarray | None = None,
    example_text_vectors: np.ndarray | None = None,
    example_has_text: np.ndarray | None = None,
) -> Examples:
    """Turn traces into examples (empty traces contribute none).

    Args:
        records: finished workflows over ``agents``.
        agents: the vocabulary, in column order.
        horizon: ``K``.
        max_prefix: ``L``, prefix agents kept per example.
        max_positions: step indices are clipped below this.
        text_vectors: one vector per record, shape ``(len(records), D)``, or ``None``
            for no text (``D = 0``).
        example_text_vectors: instead of ``text_vectors``, one vector per example (per
            step of every record, in order; see :func:`example_texts`).
        example_has_text: with ``example_text_vectors``, which examples have a text
            (default all).

    Raises:
        ValueError: a trace names an unknown agent, a vector array has the wrong number
            of rows, or both kinds of vectors are given.
    """
    index = agent_index(agents)
    if text_vectors is not None and example_text_vectors is not None:
        raise ValueError("give text_vectors or example_text_vectors, not both")
    if text_vectors is not None and len(text_vectors) != len(records):
        raise ValueError(f"text_vectors has {len(text_vectors)} rows for {len(records)} records")
    paths: list[tuple[str, ...]] = []
    labels: list[np.ndarray] = []
    owners: list[int] = []
    for row, record in enumerate(records):
        path = record.agents
        if not path:
            continue
        paths += [path[:t] for t in range(1, len(path) + 1)]
        labels.append(step_labels(index, path, horizon))
        owners += [row] * len(path)
    trace = np.asarray(owners, dtype=np.int64)
    encoded = encode_paths(index, paths, max_prefix=max_prefix, max_positions=max_positions)
    has_text = np.full(len(trace), text_vectors is not None)
    if example_text_vectors is not None:
        text = np.asarray(example_text_vectors, dtype=np.float32)
        if len(text) != len(trace):
            raise ValueError(f"example_text_vectors has {len(text)} rows for {len(trace)} examples")
        has_text = (
            np.ones(len(trace), dtype=bool)
            if example_has_text is None
            else np.asarray(example_has_text, dtype=bool).reshape(len(trace))
        )
    elif text_vectors is None:
        text = np.zeros((len(trace), 0), dtype=np.float32)
    else:
        text = np.asarray(text_vectors, dtype=np.float32)[trace]
    stacked = np.concatenate(labels) if labels else np.zeros((0, horizon), dtype=np.int64)
    return Examples(encoded, stacked, text, has_text, trace)


def task_group(record: TraceRecord) -> str:
    """Return the task a trace belongs to: its ``task`` feature (the τ-bench task whose
    trials it replays) or, for generated apps, its own ``task_id``."""
    return str(record.task_features.get("task", record.task_id))


def split_records(
    records: Sequence[TraceRecord], test_fraction: float, *, seed: int, by_task: bool = False
) -> tuple[list[TraceRecord], list[TraceRecord]]:
    """Split traces into a training and a held-out part, deterministically per ``seed``.

    Args:
        records: the traces.
        test_fraction: share of groups held out, in ``(0, 1)``.
        seed: shuffle seed.
        by_task: keep traces of one task together (see :func:`task_group`), so no task
            is on both sides.

    Returns:
        ``(train, held_out)``, each in input order.

    Raises:
        ValueError: ``test_fraction`` outside ``(0, 1)``, or a side would be empty.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    keys, shuffled = _shuffled_groups(records, by_task=by_task, seed=seed)
    if len(shuffled) < 2:
        raise ValueError(f"cannot split {len(records)} traces of {len(shuffled)} task(s) in two")
    n_test = max(1, round(test_fraction * len(shuffled)))
    return _hold_out(records, keys, set(shuffled[:n_test]))


def task_folds(
    records: Sequence[TraceRecord], folds: int, *, seed: int
) -> list[tuple[list[TraceRecord], list[TraceRecord]]]:
    """Deal the tasks of ``records`` (see :func:`task_group`) into ``folds`` folds, for
    cross-validation; the deal is deterministic per ``seed``.

    Returns:
        One ``(train, held_out)`` pair per fold, each in input order; every record is
        held out exactly once.

    Raises:
        ValueError: ``folds < 2``, or fewer tasks than folds.
    """
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    keys, shuffled = _shuffled_groups(records, by_task=True, seed=seed)
    if len(shuffled) < folds:
        raise ValueError(f"cannot deal {len(shuffled)} task(s) into {folds} folds")
    return [_hold_out(records, keys, set(shuffled[fold::folds])) for fold in range(folds)]


def _shuffled_groups(
    records: Sequence[TraceRecord], *, by_task: bool, seed: int
) -> tuple[list[str], list[str]]:
    """Return each record's group key and the distinct groups in a seeded random order."""
    keys = [task_group(r) if by_task else str(i) for i, r in enumerate(records)]
    groups = sorted(set(keys))
    order = np.random.default_rng(seed).permutation(len(groups))
    return keys, [groups[i] for i in order]


def _hold_out(
    records: Sequence[TraceRecord], keys: Sequence[str], held: set[str]
) -> tuple[list[TraceRecord], list[TraceRecord]]:
    train = [r for r, k in zip(records, keys, strict=True) if k not in held]
    test = [r for r, k in zip(records, keys, strict=True) if k in held]
    return train, test
