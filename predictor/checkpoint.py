"""GraphSAGE checkpoints: safetensors weights plus a JSON sidecar (§6).

A checkpoint folder holds ``graphsage.safetensors`` (every parameter and buffer: agent
statistics, message-passing edges, step masks) and ``graphsage.json``: format and
version, app, agents (column order), horizon ``K``, call-graph edges, model sizes, the
text encoder the model was trained with, its parameter count and how it was trained.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.torch import load_file, save_file

from pbkv.predictor.callgraph import CallGraph
from pbkv.predictor.features import AGENT_STATISTICS, reachability_masks, successor_edges
from pbkv.predictor.graphsage import (
    AnyGraphSage,
    GraphSageConfig,
    GraphSageEnsemble,
    GraphSageModel,
)

FORMAT = "pbkv-graphsage"
CHECKPOINT_VERSION = 1
WEIGHTS_FILE = "graphsage.safetensors"
SIDECAR_FILE = "graphsage.json"


class CheckpointError(ValueError):
    """A checkpoint is missing, of another format or version, or inconsistent."""


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """What the sidecar says about a checkpoint.

    Args:
        app: the app the model was trained for.
        agents: the forecast columns (``END`` last, not listed).
        edges: the call graph's ``(source, target)`` edges, ``END`` targets included.
        config: the model sizes.
        text_encoder: registry name of the text encoder used in training, or ``None``.
        text_source: what the encoder embedded per state: ``task`` (the task text) or
            ``step`` (the step's context tail, else the task text); see
            :func:`~pbkv.predictor.dataset.state_text`. Absent from older sidecars
            (``task``).
        training: free-form facts about the fit (traces, epochs, losses, seconds).
    """

    app: str
    agents: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]
    config: GraphSageConfig
    text_encoder: str | None = None
    training: dict[str, Any] = field(default_factory=dict)
    text_source: str = "task"

    @property
    def graph(self) -> CallGraph:
        return CallGraph(self.agents, self.edges)


def save_checkpoint(
    folder: str | os.PathLike[str], model: AnyGraphSage, info: CheckpointInfo
) -> Path:
    """Write ``model`` and its sidecar into ``folder`` (created if needed).

    Returns:
        The folder's path.

    Raises:
        CheckpointError: ``info`` does not match the model (sizes or agent count).
    """
    if info.config != model.config or len(info.agents) != model.agent_stats.shape[0]:
        raise CheckpointError("checkpoint info does not match the model's sizes or agents")
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path / WEIGHTS_FILE), metadata={"format": FORMAT})
    sidecar = {
        "format": FORMAT,
        "version": CHECKPOINT_VERSION,
        "app": info.app,
        "agents": list(info.agents),
        "horizon": info.config.horizon,
        "edges": [list(e) for e in info.edges],
        "config": info.config.to_dict(),
        "agent_statistics": list(AGENT_STATISTICS),
        "text_encoder": info.text_encoder,
        "text_source": info.text_source,
        "parameters": model.parameter_count(),
        "training": info.training,
    }
    (path / SIDECAR_FILE).write_text(json.dumps(sidecar, indent=2) + "\n", encoding="utf-8")
    return path


def load_checkpoint(location: str | os.PathLike[str]) -> tuple[AnyGraphSage, CheckpointInfo]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Args:
        location: the checkpoint folder, or either of its two files.

    Returns:
        The model (eval mode, on CPU) and its sidecar info.

    Raises:
        CheckpointError: a file is missing, or the sidecar is of another format or
            version, or the weights do not fit it (the message names the file).
    """
    folder = Path(location)
    if folder.is_file():
        folder = folder.parent
    sidecar_path, weights_path = folder / SIDECAR_FILE, folder / WEIGHTS_FILE
    for p in (sidecar_path, weights_path):
        if not p.is_file():
            raise CheckpointError(f"checkpoint file {p} is missing")
    info = _read_sidecar(sidecar_path)
    graph = info.graph
    try:
        state = load_file(str(weights_path))
    except Exception as exc:  # safetensors raises its own error type for a bad file
        raise CheckpointError(f"{weights_path}: not a readable safetensors file ({exc})") from exc
    held = len({key.split(".")[1] for key in state if key.startswith("members.")}) or 1
    if held != info.config.members:
        raise CheckpointError(
            f"{sidecar_path} declares {info.config.members} ensemble member(s); "
            f"{weights_path} holds {held}"
        )
    prefix = "members.0." if info.config.members > 1 else ""
    stats = state.get(f"{prefix}agent_stats")
    if stats is None:
        raise CheckpointError(f"{weights_path}: no '{prefix}agent_stats' tensor")
    members = [
        GraphSageModel(
            replace(info.config, members=1),
            successor_edges(graph),
            np.zeros(tuple(stats.shape), dtype=np.float32),
            reachability_masks(graph, info.config.horizon),
        )
        for _ in range(info.config.members)
    ]
    model: AnyGraphSage = members[0] if len(members) == 1 else GraphSageEnsemble(members)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{weights_path}: weights do not fit {sidecar_path}: {exc}") from exc
    return model.eval(), info


def _read_sidecar(path: Path) -> CheckpointInfo:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format is {raw.get('format')!r}, expected {FORMAT!r}")
    if raw.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{path}: version {raw.get('version')!r} is not supported"
            f" (expected {CHECKPOINT_VERSION})"
        )
    try:
        config = GraphSageConfig(**raw["config"])
        return CheckpointInfo(
            app=str(raw["app"]),
            agents=tuple(raw["agents"]),
            edges=tuple((str(s), str(t)) for s, t in raw["edges"]),
            config=config,
            text_encoder=raw.get("text_encoder"),
            training=dict(raw.get("training") or {}),
            text_source=str(raw.get("text_source", "task")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: bad field: {exc}") from exc
