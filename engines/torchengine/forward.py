"""One forward over a packed batch: prefill chunks and decode tokens of several
sequences together, reading and writing their KV where it lives, in the device pool.

Every token of the step goes through each layer's projections and MLP as one matrix
(the weights are read once per step, as the sim's balanced batches assume, §7.1);
attention runs per sequence over views of the pool's blocks (runs of consecutive block
ids are one view each: a decode copies nothing, a prefill chunk over several runs joins
them; nothing is re-padded); each layer writes the step's new keys and values into their
blocks with one indexed copy. The model's own modules (projections, norms, rotary
embedding, MLP) compute everything but attention, so the numbers are transformers' up to
the order of floating-point sums.

Works with Llama-family decoders (Llama, SmolLM2, Mistral, Qwen2: ``model.model.layers``
with ``self_attn.{q,k,v,o}_proj``, ``mlp``, two RMSNorms, one rotary embedding).

Shapes:
    pool keys / values of a layer: ``(blocks · block_size, kv_heads, head_dim)``
    hidden states: ``(tokens, d_model)``
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from pbkv.engines.torchengine.pool import PagedKVPools


@dataclass(frozen=True, slots=True)
class Segment:
    """One sequence's new tokens in a packed forward.

    Args:
        token_ids: the tokens to run (a prefill chunk, or the one token a decode feeds).
        cached_tokens: tokens before them whose KV is already in the pool.
        blocks: pool blocks holding the sequence's tokens ``[0, cached_tokens +
            len(token_ids))``, in order (more are allowed).
        write_from: the first new token (a position in the sequence) whose KV is
            written; those before it sit in blocks the sequence shares, which already
            hold the same KV (a full prompt hit recomputes its last token for logits).
    """

    token_ids: Sequence[int]
    cached_tokens: int
    blocks: Sequence[int]
    write_from: int = 0

    @property
    def end(self) -> int:
        return self.cached_tokens + len(self.token_ids)


class _Run(NamedTuple):
    """``tokens`` consecutive positions of a sequence held from pool slot ``slot`` on."""

    slot: int
    tokens: int


class PagedForward:
    """Run packed forwards of ``model`` over the KV in ``pools`` (see the module docstring).

    Args:
        model: a Llama-family ``*ForCausalLM`` in eval mode.
        pools: the device pool the sequences' blocks index.

    Raises:
        ValueError: the model is not of a supported family.
    """

    def __init__(self, model: PreTrainedModel, pools: PagedKVPools) -> None:
        decoder = model.get_decoder()
        layers = getattr(decoder, "layers", None)
        if layers is None or not hasattr(layers[0], "self_attn"):
            raise ValueError(f"{type(model).__name__}: not a Llama-family decoder")
        self.decoder = decoder
        self.layers = list(layers)
        self.pools = pools
        self.device = pools.device
        self.block_size = pools.layout.block_size
        config = model.config
        self.heads = int(config.num_attention_heads)
        self.kv_heads = pools.layout.kv_heads
        self.head_dim = pools.layout.head_dim
        self.scale = float(getattr(layers[0].self_attn, "scaling", self.head_dim**-0.5))

    def __call__(self, segments: Sequence[Segment]) -> torch.Tensor:
        """Run ``segments`` in one forward; write their new KV into their blocks.

        Returns:
            The post-norm hidden state of each segment's last token.

        Mutates: the device pool's slots of every new token from ``write_from`` on.

        Raises:
            ValueError: a segment's blocks cannot hold its tokens.

        Shapes:
            return: ``(len(segments), d_model)``.
        """
        runs = [self._runs(s) for s in segments]  # checks every table first
        ids, positions, slots, written = self._pack(segments)
        hidden = self.decoder.embed_tokens(ids)
        cos, sin = self.decoder.rotary_emb(hidden, positions.unsqueeze(0))
        rope = (cos[0].unsqueeze(1), sin[0].unsqueeze(1))  # (tokens, 1, head_dim)
        for index, layer in enumerate(self.layers):
            hidden = self._layer(index, layer, hidden, rope, segments, runs, slots, written)
        lasts = torch.tensor(_last_indices(segments), dtype=torch.long, device=hidden.device)
        return self.decoder.norm(hidden.index_select(0, lasts))

    # -- one layer -----------------------------------------------------------------------

    def _layer(
        self,
        index: int,
        layer: torch.nn.Module,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        segments: Sequence[Segment],
        runs: Sequence[list[_Run]],
        slots: torch.Tensor,
        written: torch.Tensor | None,
    ) -> torch.Tensor:
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        tokens = x.shape[0]
        q = attn.q_proj(x).view(tokens, self.heads, self.head_dim)
        k = attn.k_proj(x).view(tokens, self.kv_heads, self.head_dim)
        v = attn.v_proj(x).view(tokens, self.kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = rope
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keys, values = self.pools.layer_kv(index)
        if written is not None:
            k, v = k.index_select(0, written), v.index_select(0, written)
        keys.index_copy_(0, slots, k.to(keys.dtype))
        values.index_copy_(0, slots, v.to(values.dtype))
        out = torch.empty_like(q)
        start = 0
        for segment, seq_runs in zip(segments, runs, strict=True):
            n = len(segment.token_ids)
            out[start : start + n] = self._attend(
                q[start : start + n], segment, seq_runs, keys, values
            )
            start += n
        hidden = hidden + attn.o_proj(out.view(tokens, self.heads * self.head_dim))
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def _attend(
        self,
        q: torch.Tensor,
        segment: Segment,
        runs: list[_Run],
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        """Attention of one segment's queries over its sequence's KV in the pool.

        Shapes:
            q: ``(new_tokens, heads, head_dim)``; return: the same.
        """
        n = q.shape[0]
        if n == 1:
            return self._decode_attention(q, runs, keys, values)
        k = _joined(keys, runs)  # (kv_heads, context, head_dim)
        v = _joined(values, runs)
        fresh = segment.cached_tokens == 0  # plain causal: no mask, so flash kernels apply
        allowed = None if fresh else _causal(segment.cached_tokens, n, segment.end, q.device)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=allowed,
            is_causal=fresh,
            scale=self.scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)

    def _decode_attention(
        self, q: torch.Tensor, runs: list[_Run], keys: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        """Attention of one decode token over views of its runs, nothing copied.

        The query heads sharing a KV head are the rows of one matrix product per run;
        the scores of all runs share one softmax (on CPU, cheaper than SDPA's kernel
        for a single query).

        Shapes:
            q: ``(1, heads, head_dim)``; return: the same.
        """
        group = self.heads // self.kv_heads
        qg = q[0].view(self.kv_heads, group, self.head_dim)
        ks = [keys[r.slot : r.slot + r.tokens].transpose(0, 1) for r in runs]
        scores = [torch.matmul(qg, k.transpose(1, 2)) for k in ks]  # (kv_heads, group, run)
        joined = scores[0] if len(scores) == 1 else torch.cat(scores, dim=-1)
        probs = torch.softmax(joined.float() * self.scale, dim=-1).to(q.dtype)
        out = None
        start = 0
        for r in runs:
            v = values[r.slot : r.slot + r.tokens].transpose(0, 1)
            part = torch.matmul(probs[..., start : start + r.tokens], v)
            out = part if out is None else out + part
            start += r.tokens
        assert out is not None
        return out.reshape(1, self.heads, self.head_dim)

    # -- packing (host side, no device reads) --------------------------------------------

    def _pack(
        self, segments: Sequence[Segment]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Return the step's token ids, positions, the pool slots written, and which
        tokens those are (``None``: all of them)."""
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        written: list[int] = []
        for segment in segments:
            first = len(ids)
            ids.extend(segment.token_ids)
            for i in range(len(segment.token_ids)):
                pos = segment.cached_tokens + i
                positions.append(pos)
                if pos >= segment.write_from:
                    slots.append(segment.blocks[pos // bs] * bs + pos % bs)
                    written.append(first + i)
        dev = self.device
        as_long = dict(dtype=torch.long, device=dev)
        return (
            torch.tensor(ids, **as_long),
            torch.tensor(positions, **as_long),
            torch.tensor(slots, **as_long),
            None if len(written) == len(ids) else torch.tensor(written, **as_long),
        )

    def _runs(self, segment: Segment) -> list[_Run]:
        """Cut the sequence's first ``segment.end`` tokens into runs of consecutive slots."""
        bs = self.block_size
        runs: list[_Run] = []
        left = segment.end
        for block in segment.blocks:
            if left <= 0:
                break
            take = min(bs, left)
            last = runs[-1] if runs else None
            if last is not None and last.slot + last.tokens == block * bs:
                runs[-1] = _Run(last.slot, last.tokens + take)
            else:
                runs.append(_Run(block * bs, take))
            left -= take
        if left > 0:
            raise ValueError(f"{len(segment.blocks)} blocks cannot hold {segment.end} tokens")
        return runs


def _joined(pool: torch.Tensor, runs: list[_Run]) -> torch.Tensor:
    """The KV of ``runs`` as ``(kv_heads, tokens, head_dim)``: a view of the pool when
    one run holds it all, else the runs copied together (prefill: small beside its
    compute)."""
    if len(runs) == 1:
        run = runs[0]
        return pool[run.slot : run.slot + run.tokens].transpose(0, 1)
    return torch.cat([pool[r.slot : r.slot + r.tokens] for r in runs]).transpose(0, 1)


def _causal(cached: int, new: int, context: int, device: torch.device) -> torch.Tensor:
    """Return the ``(new, context)`` mask: query ``i`` sees keys ``<= cached + i``."""
    q = torch.arange(cached, cached + new, device=device).unsqueeze(1)
    k = torch.arange(context, device=device).unsqueeze(0)
    return k <= q


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _last_indices(segments: Sequence[Segment]) -> list[int]:
    out, end = [], 0
    for segment in segments:
        end += len(segment.token_ids)
        out.append(end - 1)
    return out
