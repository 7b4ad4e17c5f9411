"""``graphsage``: the learned forecaster behind the :class:`~pbkv.predictor.base.Forecaster`
interface (§6).

Every state of a call goes through the model in one forward pass: in eval mode through
:class:`~pbkv.predictor.fused_graphsage.FusedGraphSage` (the same distributions up to
float rounding, with the work that depends only on the path done once per distinct path
of the call; folded again whenever the weights change), in training mode through the
modules' own ``forward`` (dropout on). A state's text
vector is its ``hidden`` (the engine's last-prefill hidden state) when given; otherwise,
with a text encoder, the embedding (cached per text) of its text as
:func:`~pbkv.predictor.dataset.state_text` picks it for the model's text source: the
``task_text``, or with the ``step`` source the state's ``context_tail`` when it has one;
otherwise none, and ``h_txt`` is zero.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from pbkv.predictor.base import WorkflowState
from pbkv.predictor.callgraph import CallGraph
from pbkv.predictor.checkpoint import load_checkpoint
from pbkv.predictor.dataset import TEXT_SOURCES, TextSource, embed_texts, example_texts, state_text
from pbkv.predictor.features import encode_paths
from pbkv.predictor.fused_graphsage import FusedGraphSage
from pbkv.predictor.graphsage import AnyGraphSage, GraphSageBatch, GraphSageConfig
from pbkv.predictor.text import TextEncoder, make_text_encoder
from pbkv.predictor.trace import TraceRecord
from pbkv.predictor.train import TrainConfig, fit_graphsage
from pbkv.predictor.vocab import agent_index


class GraphSageForecaster:
    """Forecast with a trained :class:`~pbkv.predictor.graphsage.GraphSageModel` (or an
    ensemble of them).

    Args:
        model: the trained model (put in eval mode).
        agents: its column order (``END`` appended); must match the model.
        horizon: steps forecast, ``1..model K``; default the model's ``K``.
        text_encoder: embeds ``task_text`` for states without ``hidden``; its ``dim`` must
            be the model's ``text_dim``. Ignored by a model without text input.
        use_text: ``False`` withholds every text vector (``h_txt`` = 0), for ablations.
        text_source: what the encoder embeds per state, as the model was trained:
            ``task`` (the task text) or ``step`` (the state's ``context_tail``, else the
            task text).

    Raises:
        ValueError: agents or encoder that do not fit the model, a bad ``horizon`` or an
            unknown ``text_source``.
    """

    name = "graphsage"

    def __init__(
        self,
        model: AnyGraphSage,
        agents: Sequence[str],
        *,
        horizon: int | None = None,
        text_encoder: TextEncoder | None = None,
        use_text: bool = True,
        text_source: TextSource = "task",
    ) -> None:
        if text_source not in TEXT_SOURCES:
            raise ValueError(f"text_source must be one of {TEXT_SOURCES}, got {text_source!r}")
        self.text_source: TextSource = text_source
        self.agents: tuple[str, ...] = tuple(agents)
        self._index = agent_index(self.agents)
        if len(self.agents) != model.agent_stats.shape[0]:
            raise ValueError(
                f"model has {model.agent_stats.shape[0]} agents, got {len(self.agents)}"
            )
        k = model.config.horizon
        self.horizon = k if horizon is None else horizon
        if not 1 <= self.horizon <= k:
            raise ValueError(f"horizon must be 1 to {k} (the model's K), got {horizon}")
        text_dim = model.config.text_dim
        if text_dim and text_encoder is not None and text_encoder.dim != text_dim:
            raise ValueError(
                f"text encoder {text_encoder.name!r} gives {text_encoder.dim} values; "
                f"the model takes {text_dim}"
            )
        self.model = model.eval()
        self.text_encoder = text_encoder if text_dim else None
        self.use_text = use_text and text_dim > 0
        self._fused: FusedGraphSage | None = None

    @classmethod
    def from_checkpoint(
        cls,
        location: str | os.PathLike[str],
        *,
        horizon: int | None = None,
        text_encoder: TextEncoder | str | None = "auto",
        use_text: bool = True,
    ) -> GraphSageForecaster:
        """Load a forecaster from a checkpoint folder.

        Args:
            location: the folder (or one of its files).
            horizon: as in the constructor.
            text_encoder: ``"auto"`` builds the encoder named in the sidecar (cached);
                ``None`` uses no encoder (only ``hidden`` feeds ``h_txt``); a name or an
                encoder is used as given.
            use_text: as in the constructor.

        Raises:
            CheckpointError: the checkpoint is missing or malformed.
            ValueError: as the constructor.
        """
        model, info = load_checkpoint(location)
        encoder: TextEncoder | None
        if text_encoder == "auto":
            encoder = make_text_encoder(info.text_encoder) if info.text_encoder else None
        elif isinstance(text_encoder, str):
            encoder = make_text_encoder(text_encoder)
        else:
            encoder = text_encoder
        source: TextSource = "step" if info.text_source == "step" else "task"
        return cls(
            model,
            info.agents,
            horizon=horizon,
            text_encoder=encoder,
            use_text=use_text,
            text_source=source,
        )

    def forecast(self, states: Sequence[WorkflowState]) -> np.ndarray:
        """Forecast the next ``K`` steps of each workflow in one forward pass.

        Args:
            states: one per workflow; ``path``, and ``hidden`` or the text (``task_text``,
                ``context_tail``), are used.

        Returns:
            float64 array, shape ``(len(states), K, |V|+1)``; each row sums to 1.

        Raises:
            ValueError: a path is empty or names an unknown agent, or a ``hidden`` has
                the wrong size or a NaN or infinite value.
        """
        if not states:
            return np.zeros((0, self.horizon, len(self.agents) + 1))
        if self.model.training:  # dropout on: the modules' own forward
            batch = self.encode(states)
            with torch.inference_mode():
                probs = self.model.probabilities(batch)[:, : self.horizon]
        else:
            probs = self._fused_probabilities(states)
        out = probs.double().numpy()
        return out / out.sum(axis=-1, keepdims=True)

    def _fused_probabilities(self, states: Sequence[WorkflowState]) -> torch.Tensor:
        """Return ``(B, horizon, |V|+1)`` from :class:`FusedGraphSage`, each distinct path
        encoded and attended over once."""
        config = self.model.config
        distinct: dict[tuple[str, ...], int] = {}
        rows = np.fromiter(
            (distinct.setdefault(tuple(s.path), len(distinct)) for s in states),
            dtype=np.int64,
            count=len(states),
        )
        paths = encode_paths(
            self._index,
            list(distinct),
            max_prefix=config.max_prefix,
            max_positions=config.max_positions,
        )
        text, has_text = self._text_vectors(states)
        if self._fused is None or not self._fused.matches(self.model):
            self._fused = FusedGraphSage.from_model(self.model)
        with torch.inference_mode():
            return self._fused.probabilities(
                paths,
                torch.from_numpy(rows),
                torch.from_numpy(text),
                torch.from_numpy(has_text),
                self.horizon,
            )

    def encode(self, states: Sequence[WorkflowState]) -> GraphSageBatch:
        """Turn states into the model's input batch (see :class:`GraphSageBatch`)."""
        config = self.model.config
        paths = encode_paths(
            self._index,
            [s.path for s in states],
            max_prefix=config.max_prefix,
            max_positions=config.max_positions,
        )
        text, has_text = self._text_vectors(states)
        return GraphSageBatch.from_arrays(paths, text, has_text)

    def _text_vectors(self, states: Sequence[WorkflowState]) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(vectors (B, D), present (B,))`` for ``states``."""
        dim = self.model.config.text_dim
        if not self.use_text:
            return np.zeros((len(states), dim), dtype=np.float32), np.zeros(len(states), bool)
        to_encode: dict[str, list[int]] = {}
        hidden_rows: list[int] = []
        hidden: list[np.ndarray] = []
        for row, state in enumerate(states):
            if state.hidden is not None:
                hidden_rows.append(row)
                hidden.append(_hidden_vector(state, dim))
            elif self.text_encoder is not None:
                chosen = state_text(state.task_text, state.context_tail, self.text_source)
                if chosen:
                    to_encode.setdefault(chosen, []).append(row)
        given = (
            np.concatenate(hidden).reshape(-1, dim) if hidden else np.zeros((0, dim), np.float32)
        )
        if not np.isfinite(given).all():
            row = hidden_rows[int(np.flatnonzero(~np.isfinite(given).all(axis=1))[0])]
            raise ValueError(
                f"workflow {states[row].workflow_id!r}: hidden holds a NaN or infinite value"
            )
        if len(hidden) == len(states):  # the engine gave every state its hidden state
            return given, np.ones(len(states), bool)
        text = np.zeros((len(states), dim), dtype=np.float32)
        has_text = np.zeros(len(states), dtype=bool)
        if hidden:
            text[hidden_rows], has_text[hidden_rows] = given, True
        if to_encode and self.text_encoder is not None:
            vectors = self.text_encoder.encode(list(to_encode))
            for vector, rows in zip(vectors, to_encode.values(), strict=True):
                text[rows], has_text[rows] = vector, True
        return text, has_text


def _hidden_vector(state: WorkflowState, dim: int) -> np.ndarray:
    """Return ``state.hidden`` as a flat float32 vector of ``dim`` values.

    Raises:
        ValueError: it has another number of values.
    """
    vector = state.hidden
    if type(vector) is np.ndarray and vector.dtype == np.float32 and vector.shape == (dim,):
        return vector
    vector = np.asarray(vector, dtype=np.float32).reshape(-1)
    if vector.shape != (dim,):
        raise ValueError(
            f"workflow {state.workflow_id!r}: hidden has {vector.size} values, "
            f"the model takes {dim}"
        )
    return vector


def build_graphsage(
    agents: Sequence[str],
    *,
    horizon: int,
    traces: Iterable[TraceRecord] = (),
    graph: CallGraph | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    text_encoder: str | None = None,
    text_source: TextSource = "task",
    train: TrainConfig = TrainConfig(),  # noqa: B008 - frozen, never mutated
) -> GraphSageForecaster:
    """Load a ``graphsage`` forecaster from ``checkpoint``, or train one on ``traces``.

    Args:
        agents: the column order the forecaster must use.
        horizon: ``K``; a checkpoint must have at least this many heads.
        traces: training traces (used only without ``checkpoint``).
        graph: the call graph to train over; default the transitions ``traces`` take.
        checkpoint: a checkpoint folder.
        text_encoder: task-text encoder name; ``None`` means none when training and the
            sidecar's encoder when loading.
        text_source: what the encoder embeds per state when training here (``task`` or
            ``step``; a checkpoint's sidecar says its own).
        train: fit settings when training here.

    Raises:
        ValueError: neither a checkpoint nor a non-empty trace is given, or the
            checkpoint's agents differ from ``agents``.
        CheckpointError: the checkpoint is missing or malformed.
    """
    agents = tuple(agents)
    if checkpoint is not None:
        forecaster = GraphSageForecaster.from_checkpoint(
            checkpoint, horizon=horizon, text_encoder=text_encoder or "auto"
        )
        if forecaster.agents != agents:
            raise ValueError(
                f"checkpoint {checkpoint} forecasts agents {forecaster.agents}, not {agents}"
            )
        return forecaster
    records = [r for r in traces if r.steps]
    if not records:
        raise ValueError("forecaster 'graphsage' needs checkpoint= or non-empty traces=")
    graph = _in_order(graph, agents) if graph else CallGraph.from_traces(records, agents)
    encoder = make_text_encoder(text_encoder) if text_encoder else None
    result = fit_graphsage(
        records,
        graph,
        config=GraphSageConfig(horizon=horizon),
        train=train,
        **text_inputs(encoder, records, text_source),
    )
    return GraphSageForecaster(result.model, agents, text_encoder=encoder, text_source=text_source)


def text_inputs(
    encoder: TextEncoder | None, records: Sequence[TraceRecord], source: TextSource
) -> dict[str, np.ndarray | None]:
    """Return the text keyword arguments of :func:`~pbkv.predictor.train.fit_graphsage`.

    No encoder: none. Source ``task``: one task-text vector per record (as before per-step
    text existed). Source ``step``: one vector per step, of the text
    :func:`~pbkv.predictor.dataset.state_text` picks (steps with no text have none).
    """
    if encoder is None:
        return {}
    if source == "task":
        return {"text_vectors": encoder.encode([r.task_text for r in records])}
    vectors, present = embed_texts(encoder, example_texts(records, source))
    return {"example_text_vectors": vectors, "example_has_text": present}


def _in_order(graph: CallGraph, agents: tuple[str, ...]) -> CallGraph:
    """Return ``graph`` with its nodes in ``agents`` order (same edges).

    Raises:
        ValueError: the graph's agents are not the same set as ``agents``.
    """
    if set(graph.agents) != set(agents):
        raise ValueError(f"graph agents {sorted(graph.agents)} differ from agents {sorted(agents)}")
    if graph.agents == agents:
        return graph
    return CallGraph(agents, [(a, b) for a in agents for b in graph.successors(a)])
