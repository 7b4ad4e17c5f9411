"""An eval-only copy of a GraphSAGE model or ensemble, folded for fast CPU forecasts (§6).

:class:`FusedGraphSage` computes what
:meth:`~pbkv.predictor.graphsage.GraphSageModel.probabilities` (or the ensemble's) does in
eval mode, up to float rounding, with the same weights rearranged once:

- Everything that depends only on the path (``h_cur``, ``h_path`` and their share of the
  trunk's first layer) is computed once per *distinct* path of the batch.
- The path attention's query depends only on the current agent and its step, and every
  key is a sum of three table rows (agent, step, recency), so each query's score against
  each table row is precomputed: a score is three gathers, and the attention output is a
  scatter of the weights onto table rows followed by one small product with the tables
  already passed through each head's value projection.
- Layer norms' affine parts fold into the linear layer that follows them, the members'
  text projections run as one product on the once-normalised text, and the members'
  trunks and heads run as batched products (``bmm``) over a leading member axis.
- The batch-sized temporaries are written into scratch tensors kept from one forecast to
  the next (:class:`_Workspace`), so a forecast allocates, and faults in, almost nothing.

Build it with :meth:`FusedGraphSage.from_model`; it keeps no reference to the model's
tensors' values, so :meth:`FusedGraphSage.matches` says whether the model's weights
changed since (in-place updates bump a tensor's version).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F

from pbkv.predictor.features import EncodedPaths
from pbkv.predictor.graphsage import MASKED_LOGIT, AnyGraphSage, GraphSageEnsemble, GraphSageModel


@dataclass(frozen=True, slots=True, eq=False)
class _PathTables:
    """Per-member tables of the path attention (``M`` members, ``n`` heads, ``d = H/n``).

    Rows ``c`` of the key tables are agents ``0..V-1``, then step positions ``0..P-1``,
    then recencies ``0..R-1``, then one padding row (score ``-inf``, value 0) that every
    part of a padding key points at; ``C`` counts them all. A query is ``current agent *
    P + current position``.

    Shapes:
        scores: ``(M, V*P*n*C)`` flat, query ``q`` head ``h`` against table row ``c`` at
            ``(q*n + h)*C + c``, already divided by ``sqrt(d)``.
        values: ``(M*n, C, d)``, each table row through head ``h``'s value projection.
        value_bias: ``(M, 1, H)``.
        out_weight: ``(M, H, H)`` (transposed), out_bias ``(M, 1, H)``.
        norm_eps: the path layer norm's epsilon (its affine part is in ``trunk``).
    """

    scores: torch.Tensor
    values: torch.Tensor
    value_bias: torch.Tensor
    out_weight: torch.Tensor
    out_bias: torch.Tensor
    norm_eps: float


@dataclass(frozen=True, slots=True, eq=False)
class _TrunkTables:
    """Per-member trunk and head weights, transposed for ``x @ W`` (``A = mlp_dim``).

    Shapes:
        current: ``(M, V, A)``, the first layer's share of ``h_cur`` plus its bias and
            the path norm's shift.
        path: ``(M, H, A)``, the first layer's ``h_path`` weight times the path norm's scale.
        text: ``(M, T, A)`` or ``None``.
        second: ``(M, A, A)``, second_bias ``(M, 1, A)``.
        heads: ``(M, K*(V+1), A)`` (not transposed: the heads run as ``W @ x.T``),
            heads_bias ``(M, K*(V+1), 1)``.
    """

    current: torch.Tensor
    path: torch.Tensor
    text: torch.Tensor | None
    second: torch.Tensor
    second_bias: torch.Tensor
    heads: torch.Tensor
    heads_bias: torch.Tensor


@dataclass(frozen=True, slots=True, eq=False)
class _TextTables:
    """The members' text projections as one layer over the normalised text.

    Shapes:
        weight: ``(M*T, D)`` (each member's layer-norm scale folded in), bias ``(M*T,)``.
        norm_eps: the text layer norm's epsilon (shared by the members).
    """

    weight: torch.Tensor
    bias: torch.Tensor
    norm_eps: float


class _Workspace:
    """Scratch tensors reused from one forecast to the next, one flat float32 buffer per
    name grown to the largest batch seen.

    A 1,024-state forecast makes about 20 MB of temporaries; allocated afresh each call,
    glibc hands some of them back to the kernel on free (a process-dependent heap layout
    decides which), and the next call faults the pages in again: measured 2,200 minor
    faults and 2.5-3 ms of system time a call in such a process, none in another.
    """

    def __init__(self) -> None:
        self._flat: dict[str, torch.Tensor] = {}

    def take(self, name: str, *shape: int) -> torch.Tensor:
        """Return a contiguous ``shape`` view of buffer ``name`` (contents undefined)."""
        size = math.prod(shape)
        flat = self._flat.get(name)
        if flat is None or flat.numel() < size:
            with torch.inference_mode(False):  # an ordinary tensor: usable in any mode
                flat = self._flat[name] = torch.empty(size)
        return flat[:size].view(shape)


class FusedGraphSage:
    """Compute a GraphSAGE model's (or ensemble's) eval-mode distributions, fast.

    Shapes:
        probabilities: ``B`` states over ``U`` distinct paths -> ``(B, k, |V|+1)``.
    """

    def __init__(
        self,
        sources: tuple[torch.Tensor, ...],
        steps: torch.Tensor,
        path: _PathTables,
        trunk: _TrunkTables,
        text: _TextTables | None,
        positions: int,
    ) -> None:
        self._sources = sources
        self._versions = tuple(_version(t) for t in sources)
        self._steps = steps  # (V, K, V+1) bool, admissible columns per current agent
        self._path = path
        self._trunk = trunk
        self._text = text
        self._positions = positions
        self._workspace = _Workspace()
        self._workspace_lock = threading.Lock()  # forecasts run in worker threads

    @classmethod
    def from_model(cls, model: AnyGraphSage) -> FusedGraphSage:
        """Fold ``model``'s weights (one model or an ensemble).

        Raises:
            ValueError: ensemble members whose layer norms use different epsilons.
        """
        members = _members(model)
        with torch.no_grad():
            text = _text_tables(members)
            fused = cls(
                tuple(t for m in members for t in (*m.parameters(), *m.buffers())),
                members[0].step_masks.transpose(0, 1).contiguous(),
                _path_tables(members),
                _trunk_tables(members),
                text,
                members[0].config.max_positions,
            )
        return fused

    def matches(self, model: AnyGraphSage) -> bool:
        """Return whether ``model`` still holds the weights this was folded from: the same
        parameter and buffer tensors, none updated in place since (``load_state_dict``
        and optimiser steps update in place). Always false for a model made under
        ``torch.inference_mode`` (its tensors keep no version), so it is folded anew on
        every call."""
        sources = tuple(t for m in _members(model) for t in (*m.parameters(), *m.buffers()))
        return len(sources) == len(self._sources) and all(
            a is b and version is not None and _version(a) == version
            for a, b, version in zip(sources, self._sources, self._versions, strict=True)
        )

    def probabilities(
        self,
        paths: EncodedPaths,
        rows: torch.Tensor,
        text: torch.Tensor,
        has_text: torch.Tensor,
        horizon: int,
    ) -> torch.Tensor:
        """Return the members' mean distribution per step, for the first ``horizon`` steps.

        Args:
            paths: the ``U`` distinct encoded paths.
            rows: ``(B,)`` int64, each state's row of ``paths``.
            text: ``(B, D)`` float32 text vectors (``(B, 0)`` for a model without text).
            has_text: ``(B,)`` bool.
            horizon: heads to return, ``1..K``.

        Shapes:
            -> ``(B, horizon, |V|+1)`` float32, rows summing to 1.
        """
        with self._scratch() as ws:
            current = torch.from_numpy(paths.current)
            part = self._path_part(paths, current)  # (M, U, A)
            members, _, width = part.shape
            first = torch.index_select(
                part, 1, rows, out=ws.take("first", members, len(rows), width)
            )
            if self._text is not None and self._trunk.text is not None:
                self._add_text(ws, first, text, has_text)
            trunk = self._trunk
            hidden = ws.take("hidden", members, len(rows), width)
            torch.baddbmm(trunk.second_bias, _gelu_(first), trunk.second, out=hidden)
            # The heads run transposed, (k*(V+1), A) @ (A, B): a product only k*(V+1) columns
            # wide is several times slower the other way round, and so is a softmax over a
            # last axis that short.
            columns = self._steps.shape[-1]
            wanted = horizon * columns
            logits = torch.baddbmm(
                trunk.heads_bias[:, :wanted],
                trunk.heads[:, :wanted],
                _gelu_(hidden).transpose(1, 2),
            ).view(members, horizon, columns, -1)  # (M, k, V+1, B)
            allowed = self._steps.index_select(0, current[rows])[:, :horizon]  # (B, k, V+1)
            logits.masked_fill_(~allowed.permute(1, 2, 0), MASKED_LOGIT)
            probs = logits.sub_(logits.amax(dim=2, keepdim=True)).exp_()
            probs = probs.div_(probs.sum(dim=2, keepdim=True))
            mean = probs.mean(dim=0) if len(probs) > 1 else probs[0]
            return mean.permute(2, 0, 1).contiguous()

    @contextlib.contextmanager
    def _scratch(self) -> Iterator[_Workspace]:
        """Yield the shared scratch, or fresh scratch while another forecast holds it."""
        if not self._workspace_lock.acquire(blocking=False):
            yield _Workspace()
            return
        try:
            yield self._workspace
        finally:
            self._workspace_lock.release()

    def _path_part(self, paths: EncodedPaths, current: torch.Tensor) -> torch.Tensor:
        """Return the trunk's first-layer input from ``h_cur`` and ``h_path``, ``(M, U, A)``."""
        h_path = self._attend(paths, current)  # (M, U, H), normalised, no affine
        trunk = self._trunk
        return torch.baddbmm(trunk.current.index_select(1, current), h_path, trunk.path)

    def _attend(self, paths: EncodedPaths, current: torch.Tensor) -> torch.Tensor:
        """Attend from each path's current agent over its prefix; ``(M, U, H)``.

        The result is layer-normalised without the norm's affine part (folded into the
        trunk).
        """
        tables = self._path
        members, heads_rows, c, d = (
            tables.value_bias.shape[0],
            tables.values.shape[0],
            tables.values.shape[1],
            tables.values.shape[2],
        )
        n = heads_rows // members
        u, length = paths.prefix.shape
        columns = torch.from_numpy(self._key_columns(paths)).view(3, u, 1, length)
        query = current * self._positions + torch.from_numpy(paths.current_position)
        head = torch.arange(n).view(1, n)
        at_query = ((query.view(u, 1) * n + head) * c).view(1, u, n, 1) + columns
        at_row = ((head * u + torch.arange(u).view(u, 1)) * c).view(1, u, n, 1) + columns
        parts = tables.scores.index_select(1, at_query.view(-1))  # (M, 3*U*n*L)
        scores = parts.view(members, 3, u, n, length).sum(dim=1)  # padding: -inf
        weights = torch.softmax(scores, dim=-1).unsqueeze(1).expand(-1, 3, -1, -1, -1)
        mix = torch.zeros(members, n * u * c)
        mix.index_add_(1, at_row.view(-1), weights.reshape(members, -1))
        mix = mix.view(members * n, u, c)  # attention weight per (head, path, table row)
        values = torch.bmm(mix, tables.values).view(members, n, u, d).transpose(1, 2)
        values = values.reshape(members, u, n * d) + tables.value_bias
        out = torch.baddbmm(tables.out_bias, values, tables.out_weight)
        return F.layer_norm(out, out.shape[-1:], eps=tables.norm_eps)

    def _key_columns(self, paths: EncodedPaths) -> np.ndarray:
        """Return the table rows of each key's agent, position and recency, ``(3, U, L)``."""
        v = self._steps.shape[0]
        pad = self._path.values.shape[1] - 1
        columns = np.stack([paths.prefix, paths.positions + v, paths.recency + v + self._positions])
        columns[:, paths.padding] = pad
        return columns

    def _add_text(
        self, ws: _Workspace, first: torch.Tensor, text: torch.Tensor, has_text: torch.Tensor
    ) -> None:
        """Add the text's share of the trunk's first layer to ``first`` (in place) where a
        state has text."""
        assert self._text is not None and self._trunk.text is not None
        chosen = has_text.nonzero().view(-1)
        if not len(chosen):
            return
        every = len(chosen) == len(has_text)
        vectors = text if every else text[chosen]
        rows, dim = vectors.shape
        normed = ws.take("normed", rows, dim)
        torch.ops.aten.native_layer_norm.out(  # F.layer_norm without affine, into scratch
            vectors,
            [dim],
            None,
            None,
            self._text.norm_eps,
            out0=normed,
            out1=ws.take("norm_mean", rows, 1),
            out2=ws.take("norm_rstd", rows, 1),
        )
        weight = self._text.weight
        projected = ws.take("projected", rows, weight.shape[0])
        _gelu_(torch.addmm(self._text.bias, normed, weight.t(), out=projected))
        members = len(first)
        by_member = ws.take("by_member", members, rows, weight.shape[0] // members)
        by_member.copy_(projected.view(rows, members, -1).transpose(0, 1))  # (M, R, T)
        if every:
            first.baddbmm_(by_member, self._trunk.text)
        else:
            first.index_add_(1, chosen, torch.bmm(by_member, self._trunk.text))


def _gelu_(x: torch.Tensor) -> torch.Tensor:
    """Apply the exact (erf) GELU to ``x`` in place and return it (``F.gelu``'s values)."""
    return torch.ops.aten.gelu_(x)


def _version(tensor: torch.Tensor) -> int | None:
    """Return the tensor's in-place update count, or ``None`` for an inference tensor."""
    return None if tensor.is_inference() else tensor._version


def _members(model: AnyGraphSage) -> list[GraphSageModel]:
    if isinstance(model, GraphSageEnsemble):
        return [cast(GraphSageModel, m) for m in model.members]
    return [model]


def _stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(tensors).contiguous()


def _path_tables(members: list[GraphSageModel]) -> _PathTables:
    scores, values, value_bias, out_weight, out_bias = [], [], [], [], []
    for m in members:
        mha = m.attention
        nodes = m.node_embeddings()  # (V, H)
        h, n = nodes.shape[-1], mha.num_heads
        d = h // n
        pad = torch.zeros(1, h)  # its score is set to -inf below
        keys = torch.cat([nodes, m.position_embedding.weight, m.recency_embedding.weight, pad])
        queries = (nodes[:, None] + m.position_embedding.weight[None]).reshape(-1, h)
        w_q, w_k, w_v = mha.in_proj_weight.split(h)
        b_q, _, b_v = mha.in_proj_bias.split(h)  # the key bias shifts every score equally
        q = F.linear(queries, w_q, b_q).view(-1, n, d)
        q_in = torch.einsum("qnd,ndh->qnh", q, w_k.view(n, d, h))  # (V*P, n, H)
        score = torch.einsum("qnh,ch->qnc", q_in, keys) / math.sqrt(d)
        score[..., -1] = float("-inf")
        scores.append(score.reshape(-1))
        values.append(torch.einsum("ndh,ch->ncd", w_v.view(n, d, h), keys))
        value_bias.append(b_v.view(1, h))
        out_weight.append(mha.out_proj.weight.t())
        out_bias.append(mha.out_proj.bias.view(1, h))
    eps = _shared_eps([m.path_norm.eps for m in members], "path_norm")
    return _PathTables(
        _stack(scores),
        torch.cat(values).contiguous(),
        _stack(value_bias),
        _stack(out_weight),
        _stack(out_bias),
        eps,
    )


def _trunk_tables(members: list[GraphSageModel]) -> _TrunkTables:
    current, path, text, second, second_bias, heads, heads_bias = ([] for _ in range(7))
    for m in members:
        h = m.config.hidden_dim
        first, second_layer = m.trunk[0], m.trunk[3]
        w_cur, w_path, w_text = first.weight.split([h, h, first.weight.shape[1] - 2 * h], dim=1)
        shift = F.linear(m.path_norm.bias, w_path)  # the norm's shift through the layer
        current.append(F.linear(m.node_embeddings(), w_cur, first.bias + shift))
        path.append((w_path * m.path_norm.weight).t())
        text.append(w_text.t())
        second.append(second_layer.weight.t())
        second_bias.append(second_layer.bias.view(1, -1))
        heads.append(torch.cat([head.weight for head in m.heads]))
        heads_bias.append(torch.cat([head.bias for head in m.heads]).view(-1, 1))
    has_text = members[0].config.text_dim > 0
    return _TrunkTables(
        _stack(current),
        _stack(path),
        _stack(text) if has_text else None,
        _stack(second),
        _stack(second_bias),
        _stack(heads),
        _stack(heads_bias),
    )


def _text_tables(members: list[GraphSageModel]) -> _TextTables | None:
    if not members[0].config.text_dim:
        return None
    weights = [m.text_proj.weight * m.text_norm.weight for m in members]
    biases = [F.linear(m.text_norm.bias, m.text_proj.weight, m.text_proj.bias) for m in members]
    eps = _shared_eps([m.text_norm.eps for m in members], "text_norm")
    return _TextTables(torch.cat(weights).contiguous(), torch.cat(biases).contiguous(), eps)


def _shared_eps(values: list[float], name: str) -> float:
    if len(set(values)) != 1:
        raise ValueError(f"ensemble members' {name} epsilons differ: {values}")
    return values[0]
