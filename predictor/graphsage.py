"""The GraphSAGE K-step agent predictor (paper Fig. 3, §6).

Three signals are fused: where the workflow is in the call graph (``h_cur``, a 2-layer
``SAGEConv`` embedding of the current agent), how it got there (``h_path``, attention from
the current agent over the executed prefix, position-aware and masked for padding) and
what the request is about (``h_txt``, a projection of a text/hidden-state vector; zeros
when none is given). An MLP over ``[h_cur; h_path; h_txt]`` feeds ``K`` heads, each a
distribution over the agents and ``END``; step ``t+k`` is the agent at that step *given
the workflow is alive before it* (the convention of :mod:`pbkv.predictor.base`), and
columns no walk of the call graph reaches are masked out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import SAGEConv

from pbkv.predictor.features import IGNORE_LABEL, EncodedPaths

MASKED_LOGIT = -1e4
"""Added to the logit of a column the call graph makes impossible (softmax gives 0)."""


@dataclass(frozen=True, slots=True)
class GraphSageConfig:
    """Sizes of a :class:`GraphSageModel`; the defaults give about 350K parameters.

    ``|V|`` and ``F`` (role-prompt statistics per agent) come from the model's
    ``agent_stats``.

    Args:
        horizon: ``K``, the number of heads.
        text_dim: ``D``, size of the text/hidden vector; 0 drops ``h_txt`` entirely.
        agent_dim: learned agent embedding size.
        hidden_dim: ``H``, size of ``h_cur`` and ``h_path``.
        text_proj_dim: ``T``, size of ``h_txt``.
        mlp_dim: width of the MLP trunk.
        attention_heads: heads of the path attention (divides ``hidden_dim``).
        max_prefix: ``L``, the most recent prefix agents attended over.
        max_positions: step positions embedded (later steps share the last one).
        dropout: dropout on the text vector, in the MLP trunk and in the attention.
        members: independently trained copies whose distributions are averaged (a deep
            ensemble, Lakshminarayanan et al. 2017); 1 is a single model. Each member
            has all the sizes above.
    """

    horizon: int = 3
    text_dim: int = 0
    agent_dim: int = 32
    hidden_dim: int = 128
    text_proj_dim: int = 128
    mlp_dim: int = 256
    attention_heads: int = 4
    max_prefix: int = 32
    max_positions: int = 64
    dropout: float = 0.3
    members: int = 1

    def __post_init__(self) -> None:
        for name in ("horizon", "agent_dim", "hidden_dim", "mlp_dim", "members"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_prefix", "max_positions", "attention_heads", "text_proj_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.text_dim < 0:
            raise ValueError(f"text_dim must be >= 0, got {self.text_dim}")
        if self.hidden_dim % self.attention_heads:
            raise ValueError(
                f"attention_heads ({self.attention_heads}) must divide hidden_dim "
                f"({self.hidden_dim})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict[str, int | float]:
        """Return the fields as a JSON-ready dict (for the checkpoint sidecar)."""
        return asdict(self)


class GraphSageBatch(NamedTuple):
    """A batch of workflow states as tensors.

    Shapes:
        current: ``(B,)`` int64, the current agent.
        prefix: ``(B, L)`` int64, the executed prefix (last ``L`` agents, current included).
        positions: ``(B, L)`` int64, step index of each prefix entry (clipped).
        padding: ``(B, L)`` bool, ``True`` at padding.
        current_position: ``(B,)`` int64, the current step's index (clipped).
        recency: ``(B, L)`` int64, steps back from the current agent (0 = current).
        text: ``(B, D)`` float32, the text/hidden vector (ignored where ``has_text`` is
            false; ``(B, 0)`` when the model has no text input).
        has_text: ``(B,)`` bool.
    """

    current: torch.Tensor
    prefix: torch.Tensor
    positions: torch.Tensor
    padding: torch.Tensor
    current_position: torch.Tensor
    recency: torch.Tensor
    text: torch.Tensor
    has_text: torch.Tensor

    @classmethod
    def from_arrays(
        cls, paths: EncodedPaths, text: np.ndarray, has_text: np.ndarray
    ) -> GraphSageBatch:
        """Wrap numpy inputs (no copy where the dtypes already match).

        Args:
            paths: encoded prefixes, batch ``B``.
            text: float array, shape ``(B, D)``.
            has_text: bool array, shape ``(B,)``.
        """
        return cls(
            torch.from_numpy(paths.current),
            torch.from_numpy(paths.prefix),
            torch.from_numpy(paths.positions),
            torch.from_numpy(paths.padding),
            torch.from_numpy(paths.current_position),
            torch.from_numpy(paths.recency),
            torch.from_numpy(np.ascontiguousarray(text, dtype=np.float32)),
            torch.from_numpy(np.asarray(has_text, dtype=bool)),
        )

    def select(self, rows: torch.Tensor) -> GraphSageBatch:
        """Return the rows ``rows`` of every field."""
        return GraphSageBatch(*(field[rows] for field in self))


class GraphSageModel(nn.Module):
    """Forecast ``K`` steps of agents ∪ {END} from graph position, path and text.

    Args:
        config: sizes.
        edges: message-passing edges over the agents (source row 0, target row 1),
            shape ``(2, E)``; see :func:`~pbkv.predictor.features.successor_edges`.
        agent_stats: role-prompt statistics, shape ``(|V|, F)`` (``F`` may be 0).
        step_masks: admissible columns per step and current agent, shape
            ``(K, |V|, |V|+1)``; see :func:`~pbkv.predictor.features.reachability_masks`.

    Shapes:
        forward: :class:`GraphSageBatch` of ``B`` states -> logits ``(B, K, |V|+1)``.
    """

    edge_index: torch.Tensor  # buffers, registered in __init__
    agent_stats: torch.Tensor
    step_masks: torch.Tensor

    def __init__(
        self,
        config: GraphSageConfig,
        edges: np.ndarray,
        agent_stats: np.ndarray,
        step_masks: np.ndarray,
    ) -> None:
        super().__init__()
        if agent_stats.ndim != 2 or len(agent_stats) < 1:
            raise ValueError(f"agent_stats must have shape (|V|, F), got {agent_stats.shape}")
        v, k = len(agent_stats), config.horizon
        _check_shape("step_masks", step_masks, (k, v, v + 1))
        if edges.ndim != 2 or edges.shape[0] != 2:
            raise ValueError(f"edges must have shape (2, E), got {edges.shape}")
        self.config = config
        h = config.hidden_dim
        self.register_buffer("edge_index", torch.as_tensor(edges, dtype=torch.long))
        self.register_buffer("agent_stats", torch.as_tensor(agent_stats, dtype=torch.float32))
        self.register_buffer("step_masks", torch.as_tensor(step_masks, dtype=torch.bool))
        self.agent_embedding = nn.Embedding(v, config.agent_dim)
        self.sage1 = SAGEConv(config.agent_dim + agent_stats.shape[1], h)
        self.sage2 = SAGEConv(h, h)
        self.position_embedding = nn.Embedding(config.max_positions, h)
        self.recency_embedding = nn.Embedding(config.max_prefix, h)
        self.attention = nn.MultiheadAttention(
            h, config.attention_heads, dropout=config.dropout, batch_first=True
        )
        self.path_norm = nn.LayerNorm(h)
        text_out = config.text_proj_dim if config.text_dim else 0
        if config.text_dim:
            self.text_norm = nn.LayerNorm(config.text_dim)
            self.text_dropout = nn.Dropout(config.dropout)
            self.text_proj = nn.Linear(config.text_dim, text_out)
        self.trunk = nn.Sequential(
            nn.Linear(2 * h + text_out, config.mlp_dim),
            nn.GELU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.mlp_dim, config.mlp_dim),
            nn.GELU(),
            nn.Dropout(config.dropout),
        )
        self.heads = nn.ModuleList(nn.Linear(config.mlp_dim, v + 1) for _ in range(k))

    def node_embeddings(self) -> torch.Tensor:
        """Return every agent's 2-layer GraphSAGE embedding.

        Shapes:
            ``(|V|, H)``.
        """
        x = torch.cat([self.agent_embedding.weight, self.agent_stats], dim=-1)
        x = F.gelu(self.sage1(x, self.edge_index))
        return self.sage2(x, self.edge_index)

    def forward(self, batch: GraphSageBatch) -> torch.Tensor:
        """Return masked logits of each step's distribution.

        Shapes:
            batch of ``B`` -> ``(B, K, |V|+1)``; impossible columns hold
            :data:`MASKED_LOGIT`-shifted values.
        """
        nodes = self.node_embeddings()  # (V, H)
        h_cur = nodes[batch.current]  # (B, H)
        h_path = self.path_summary(nodes, h_cur, batch)  # (B, H)
        parts = [h_cur, h_path]
        if self.config.text_dim:
            parts.append(self.text_summary(batch))  # (B, T)
        trunk = self.trunk(torch.cat(parts, dim=-1))  # (B, mlp)
        logits = torch.stack([head(trunk) for head in self.heads], dim=1)  # (B, K, V+1)
        allowed = self.step_masks[:, batch.current].transpose(0, 1)  # (B, K, V+1)
        return logits.masked_fill(~allowed, MASKED_LOGIT)

    def path_summary(
        self, nodes: torch.Tensor, h_cur: torch.Tensor, batch: GraphSageBatch
    ) -> torch.Tensor:
        """Attend from the current agent (at its step) over the executed prefix.

        Each key is the agent's node embedding plus embeddings of its absolute step
        (how far the workflow has run: retry counts) and of its distance back from the
        current step (the recent pattern).

        Shapes:
            nodes ``(|V|, H)``, h_cur ``(B, H)`` -> ``(B, H)``.
        """
        keys = (
            nodes[batch.prefix]
            + self.position_embedding(batch.positions)
            + self.recency_embedding(batch.recency)
        )  # (B, L, H)
        query = h_cur + self.position_embedding(batch.current_position)  # (B, H)
        return self.path_norm(self.attend(query, keys, batch.padding))

    def attend(
        self, query: torch.Tensor, keys: torch.Tensor, padding: torch.Tensor
    ) -> torch.Tensor:
        """Multi-head attention of one query per row, with ``self.attention``'s weights.

        Computes what ``self.attention(query[:, None], keys, keys, key_padding_mask=
        padding)`` does, but folds the key and value projections into the query side
        (``q . W_k x = (W_k^T q) . x`` and ``sum_l a_l W_v x_l = W_v sum_l a_l x_l``), so
        no ``(B, L, H) x (H, H)`` product is formed: a batch of 1024 states costs a few
        milliseconds on one CPU core.

        Shapes:
            query ``(B, H)``, keys ``(B, L, H)``, padding ``(B, L)`` -> ``(B, H)``.
        """
        mha = self.attention
        h, n = query.shape[-1], mha.num_heads
        d = h // n
        w_q, w_k, w_v = mha.in_proj_weight.split(h)  # each (H, H)
        b_q, _, b_v = mha.in_proj_bias.split(h)  # the key bias shifts every score equally
        q = F.linear(query, w_q, b_q).view(-1, n, d)  # (B, n, d)
        q_in = torch.einsum("bnd,ndh->bnh", q, w_k.view(n, d, h))  # (B, n, H)
        scores = torch.einsum("blh,bnh->bnl", keys, q_in) / math.sqrt(d)  # (B, n, L)
        scores = scores.masked_fill(padding.unsqueeze(1), float("-inf"))
        weights = F.dropout(torch.softmax(scores, dim=-1), mha.dropout, self.training)
        mixed = torch.einsum("bnl,blh->bnh", weights, keys)  # (B, n, H)
        values = torch.einsum("bnh,ndh->bnd", mixed, w_v.view(n, d, h)) + b_v.view(n, d)
        return mha.out_proj(values.reshape(-1, h))  # (B, H)

    def text_summary(self, batch: GraphSageBatch) -> torch.Tensor:
        """Project the text vector; zeros where a state has none.

        Shapes:
            text ``(B, D)`` -> ``(B, T)``.
        """
        projected = F.gelu(self.text_proj(self.text_dropout(self.text_norm(batch.text))))
        return projected * batch.has_text.unsqueeze(-1).to(projected.dtype)

    def loss(self, batch: GraphSageBatch, labels: torch.Tensor) -> torch.Tensor:
        """Return the mean cross-entropy over every labelled (state, step) pair.

        Args:
            batch: ``B`` states.
            labels: ``(B, K)`` int64 columns; :data:`IGNORE_LABEL` is masked out.

        Shapes:
            -> scalar.
        """
        logits = self(batch)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_LABEL
        )

    def probabilities(self, batch: GraphSageBatch) -> torch.Tensor:
        """Return each step's distribution (softmax of :meth:`forward`).

        Shapes:
            ``(B, K, |V|+1)``, rows summing to 1.
        """
        return torch.softmax(self(batch), dim=-1)

    def parameter_count(self) -> int:
        """Return the number of trainable parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


class GraphSageEnsemble(nn.Module):
    """Average the step distributions of several trained :class:`GraphSageModel` s.

    Members differ only in their initialisation, shuffling and validation split; on
    small trace sets (τ-bench's 200 episodes) their average is steadier and more
    accurate than any one of them. Offers what a forecaster uses of a model.

    Args:
        members: trained models of one size (``config.members`` is ignored on them).

    Shapes:
        forward: :class:`GraphSageBatch` of ``B`` states -> log of the averaged
        distribution ``(B, K, |V|+1)`` (a valid logit: its softmax is the average).

    Raises:
        ValueError: no members, or members of different sizes or graphs.
    """

    def __init__(self, members: Sequence[GraphSageModel]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least two members, got {len(members)}")
        first = members[0]
        for member in members[1:]:
            if replace(member.config, members=1) != replace(first.config, members=1) or not (
                torch.equal(member.step_masks, first.step_masks)
                and torch.equal(member.edge_index, first.edge_index)
            ):
                raise ValueError("ensemble members must share sizes and call graph")
        self.members = nn.ModuleList(members)
        self.config = replace(first.config, members=len(members))

    @property
    def agent_stats(self) -> torch.Tensor:
        """``(|V|, F)``: the first member's role-prompt statistics."""
        return self._member_models()[0].agent_stats

    def probabilities(self, batch: GraphSageBatch) -> torch.Tensor:
        """Return the members' mean distribution per step.

        Shapes:
            ``(B, K, |V|+1)``, rows summing to 1.
        """
        return torch.stack([m.probabilities(batch) for m in self._member_models()]).mean(dim=0)

    def forward(self, batch: GraphSageBatch) -> torch.Tensor:
        """Return the log of :meth:`probabilities` (``(B, K, |V|+1)``)."""
        return torch.log(self.probabilities(batch).clamp_min(1e-30))

    def _member_models(self) -> list[GraphSageModel]:
        return [cast(GraphSageModel, m) for m in self.members]

    def parameter_count(self) -> int:
        """Return the number of trainable parameters over all members."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


AnyGraphSage = GraphSageModel | GraphSageEnsemble
"""What a forecaster or checkpoint holds: one model or an ensemble of them."""


def _check_shape(name: str, array: np.ndarray, expected: tuple[int, ...]) -> None:
    if tuple(array.shape) != expected:
        raise ValueError(f"{name} must have shape {expected}, got {tuple(array.shape)}")
