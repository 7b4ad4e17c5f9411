"""Numeric inputs of the GraphSAGE forecaster: agent features, encoded paths, step masks (§6).

Plain numpy, no torch: what the model sees of the call graph, of the agents' role
prompts, and of a workflow's executed prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from pbkv.predictor.callgraph import CallGraph
from pbkv.predictor.trace import END, TraceRecord
from pbkv.predictor.vocab import check_path

AGENT_STATISTICS = (
    "log_preamble_tokens",
    "log_role_tokens",
    "log_context_tokens",
    "log_output_tokens",
    "log1p_gap_s",
    "visit_share",
    "mean_step_fraction",
    "out_degree",
    "in_degree",
    "ends",
    "self_loop",
)
"""Column names of :func:`agent_statistics`."""

IGNORE_LABEL = -100
"""Label of a head that is past the workflow's end (masked out of the loss)."""


@dataclass(frozen=True, slots=True)
class EncodedPaths:
    """Executed prefixes as fixed-width integer arrays (last ``max_prefix`` agents kept).

    Args:
        current: the current agent's column, shape ``(B,)``.
        prefix: agent columns of the kept prefix, left-aligned, shape ``(B, L)``; padding
            is column 0.
        positions: 0-based step index of each prefix entry within the whole path,
            clipped to ``max_positions - 1``, shape ``(B, L)``.
        padding: ``True`` where ``prefix`` is padding, shape ``(B, L)``.
        current_position: the current step's clipped index, shape ``(B,)``.
        recency: steps between each prefix entry and the current one (0 for the current
            agent, padding 0), shape ``(B, L)``.
    """

    current: np.ndarray
    prefix: np.ndarray
    positions: np.ndarray
    padding: np.ndarray
    current_position: np.ndarray
    recency: np.ndarray


def agent_statistics(graph: CallGraph, records: Iterable[TraceRecord]) -> np.ndarray:
    """Return per-agent role-prompt and call-graph statistics, standardised per column.

    Columns are :data:`AGENT_STATISTICS`: mean log token counts of the agent's prompt
    segments and output, mean log gap, share of all steps, mean relative position in its
    workflows, and its degree, ``-> END`` and self-loop flags in ``graph``. Agents never
    seen in ``records`` get zeros for the trace columns. Each column is then centred and
    scaled to unit deviation over the agents (a constant column becomes 0).

    Args:
        graph: the app's call graph (its agent order is the row order).
        records: traces over ``graph``'s agents.

    Returns:
        float32 array, shape ``(|V|, len(AGENT_STATISTICS))``.
    """
    n = len(graph.agents)
    sums = np.zeros((n, 7))
    visits = np.zeros(n)
    for record in records:
        for step_no, step in enumerate(record.steps):
            row = graph.index(step.agent)
            tokens = {"preamble": 0, "role": 0, "context": 0}
            for segment in step.segments:
                tokens[segment.kind] += segment.tokens
            sums[row] += (
                np.log1p(tokens["preamble"]),
                np.log1p(tokens["role"]),
                np.log1p(tokens["context"]),
                np.log1p(step.output_tokens),
                np.log1p(step.gap_s),
                0.0,
                step_no / max(1, len(record.steps) - 1),
            )
            visits[row] += 1
    means = sums / np.maximum(visits, 1)[:, None]
    means[:, 5] = visits / max(1.0, visits.sum())
    adjacency = graph.admissible[:n]
    structure = np.stack(
        [
            adjacency[:, :n].sum(axis=1),
            adjacency[:, :n].sum(axis=0),
            adjacency[:, n],
            np.diag(adjacency[:, :n]),
        ],
        axis=1,
    ).astype(np.float64)
    table = np.concatenate([means, structure], axis=1)
    spread = table.std(axis=0)
    centred = table - table.mean(axis=0)
    scaled = np.divide(centred, spread, out=np.zeros_like(centred), where=spread > 1e-9)
    return scaled.astype(np.float32)


def successor_edges(graph: CallGraph) -> np.ndarray:
    """Return message-passing edges ``successor -> agent`` for every call-graph edge.

    A node aggregates over the agents that may run after it, so its embedding summarises
    where a workflow can go from there. ``END`` is not a node.

    Returns:
        int64 array, shape ``(2, E)``: row 0 the message source, row 1 the target.
    """
    n = len(graph.agents)
    sources, targets = np.nonzero(graph.admissible[:n, :n])
    return np.stack([targets, sources]).astype(np.int64)


def reachability_masks(graph: CallGraph, horizon: int) -> np.ndarray:
    """Return which columns step ``t+k`` may take, given the current agent and being alive.

    Step ``t+k`` runs agent ``b`` only if a walk of ``k`` edges leads there from the
    current agent, and is ``END`` only if a walk of ``k-1`` edges reaches an agent with an
    ``-> END`` edge. A step no walk reaches is ``END`` only (the workflow has surely ended).

    Returns:
        bool array, shape ``(K, |V|, |V|+1)``: ``[k-1, a, x]`` for current agent ``a``.
    """
    n = len(graph.agents)
    step = graph.admissible[:n, :n].astype(np.int64)
    ends = graph.admissible[:n, n]
    walk = np.eye(n, dtype=np.int64)  # agents reachable in k-1 steps
    masks = np.zeros((horizon, n, n + 1), dtype=bool)
    for k in range(horizon):
        masks[k, :, n] = (walk @ ends.astype(np.int64)) > 0
        walk = np.minimum(walk @ step, 1)
        masks[k, :, :n] = walk > 0
        masks[k, ~masks[k].any(axis=1), n] = True
    return masks


def encode_paths(
    index: dict[str, int],
    paths: Sequence[Sequence[str]],
    *,
    max_prefix: int,
    max_positions: int,
) -> EncodedPaths:
    """Encode executed prefixes for the model (see :class:`EncodedPaths`).

    ``L`` is ``max_prefix`` or the longest path of the batch, whichever is shorter.

    Args:
        index: the vocabulary (``agent -> column``, :func:`~pbkv.predictor.vocab.agent_index`).
        paths: one non-empty path per workflow, the current agent last.
        max_prefix: ``L``, the most recent agents kept.
        max_positions: step indices are clipped below this.

    Raises:
        ValueError: a path is empty or names an unknown agent.
    """
    _check_paths(index, paths)
    b = len(paths)
    lengths = np.fromiter((len(p) for p in paths), dtype=np.int64, count=b)
    max_prefix = min(max_prefix, int(lengths.max(initial=1)))
    kept = np.minimum(lengths, max_prefix)
    rows = np.repeat(np.arange(b), kept)  # one entry per kept agent, path by path
    starts = np.cumsum(kept) - kept
    cols = np.arange(len(rows)) - np.repeat(starts, kept)  # 0-based slot in its row
    kept_agents = chain.from_iterable(p[-max_prefix:] for p in paths)
    columns = np.fromiter(map(index.__getitem__, kept_agents), dtype=np.int64, count=len(rows))
    prefix = np.zeros((b, max_prefix), dtype=np.int64)
    positions = np.zeros((b, max_prefix), dtype=np.int64)
    padding = np.ones((b, max_prefix), dtype=bool)
    recency = np.zeros((b, max_prefix), dtype=np.int64)
    prefix[rows, cols] = columns
    first = np.repeat(lengths - kept, kept)  # step index of each row's first kept agent
    positions[rows, cols] = np.minimum(first + cols, max_positions - 1)
    padding[rows, cols] = False
    recency[rows, cols] = np.repeat(kept - 1, kept) - cols
    current = prefix[np.arange(b), kept - 1]
    current_position = np.minimum(lengths - 1, max_positions - 1)
    return EncodedPaths(current, prefix, positions, padding, current_position, recency)


def _check_paths(index: dict[str, int], paths: Sequence[Sequence[str]]) -> None:
    """Raise as :func:`~pbkv.predictor.vocab.check_path` would on the first bad path."""
    agents = index.keys() - {END}
    for path in paths:
        if not path or not agents.issuperset(path):
            check_path(index, path)


def step_labels(index: dict[str, int], path: Sequence[str], horizon: int) -> np.ndarray:
    """Return the conditional K-step labels of every prefix of a finished ``path``.

    For the prefix of length ``t`` (its last agent current), head ``k`` is labelled with
    the agent of step ``t+k``, with ``END`` for the first step past the last agent, and
    with :data:`IGNORE_LABEL` beyond that (the workflow was not alive before that step).

    Returns:
        int64 array, shape ``(len(path), K)``; row ``t-1`` belongs to the prefix of length
        ``t``.
    """
    columns = [index[a] for a in path] + [len(index) - 1]  # END is the last column
    labels = np.full((len(path), horizon), IGNORE_LABEL, dtype=np.int64)
    for t in range(1, len(path) + 1):
        for k in range(1, horizon + 1):
            step = t + k - 1  # 0-based index of step t+k in columns
            if step < len(columns):
                labels[t - 1, k - 1] = columns[step]
    return labels
