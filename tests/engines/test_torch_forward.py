"""Tests for engines/torchengine/forward.py: one packed forward over the paged pool.

The bar is transformers' own numbers: the last hidden state of each segment and the KV it
writes equal a plain forward of the whole sequence (fp32, tight tolerance), whatever the
segments' mix (prefill chunks over cached prefixes, decode tokens, fresh prompts) and
however their blocks are scattered over the pool.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pbkv.engines.torchengine import KVLayout, PagedKVPools, load_model
from pbkv.engines.torchengine.forward import PagedForward, Segment

BS = 4


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return load_model("tiny", device="cpu")


def pools_for(model: torch.nn.Module, blocks: int) -> PagedKVPools:
    layout = KVLayout.of(model.config, BS, torch.float32)
    return PagedKVPools(layout, blocks, 0, torch.device("cpu"))


def tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 49152, n)]


def plain(model: torch.nn.Module, ids: list[int]) -> tuple[torch.Tensor, list]:
    """Post-norm hidden states ``(T, d)`` and per-layer ``(keys, values)`` ``(H, T, D)``."""
    with torch.inference_mode():
        out = model.model(torch.tensor([ids]), use_cache=True)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    layers = [(layer.keys[0], layer.values[0]) for layer in cache.layers]
    return out.last_hidden_state[0], layers


def test_a_packed_step_of_chunks_and_decodes_matches_plain_forwards(tiny) -> None:
    pools = pools_for(tiny, 40)
    forward = PagedForward(tiny, pools)
    # scattered tables: runs of one, two and three blocks, out of order
    a_blocks, b_blocks, c_blocks = [7, 3, 4, 20, 21, 22, 9], [30, 12, 13, 5], [33, 34, 35, 1]
    a, b, c = tokens(23, 1), tokens(11, 2), tokens(14, 3)
    with torch.inference_mode():
        forward([Segment(a[:9], 0, a_blocks), Segment(b[:10], 0, b_blocks)])  # earlier steps
        hidden = forward(
            [
                Segment(a[9:23], 9, a_blocks),  # a chunk over a cached prefix
                Segment(b[10:11], 10, b_blocks),  # a decode token
                Segment(c, 0, c_blocks),  # a fresh prompt, whole
            ]
        )
    assert hidden.shape == (3, 96)
    for row, (ids, blocks) in enumerate([(a, a_blocks), (b, b_blocks), (c, c_blocks)]):
        want_hidden, want_kv = plain(tiny, ids)
        torch.testing.assert_close(hidden[row], want_hidden[-1], rtol=1e-5, atol=1e-5)
        for (k, v), (gk, gv) in zip(want_kv, pools.gather(blocks, len(ids)), strict=True):
            torch.testing.assert_close(gk[0], k, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(gv[0], v, rtol=1e-5, atol=1e-5)


def test_tokens_before_write_from_read_the_shared_blocks_and_leave_them(tiny) -> None:
    pools = pools_for(tiny, 8)
    forward = PagedForward(tiny, pools)
    ids = tokens(8, 4)  # two full blocks, shared
    with torch.inference_mode():
        forward([Segment(ids, 0, [2, 6])])
        shared = pools.gpu[:, :, [2, 6]].clone()
        hidden = forward([Segment(ids[7:], 7, [2, 6, 1], write_from=8)])  # recompute the last
    torch.testing.assert_close(hidden[0], plain(tiny, ids)[0][-1], rtol=1e-5, atol=1e-5)
    assert torch.equal(pools.gpu[:, :, [2, 6]], shared)
    assert not pools.gpu[:, :, 1].any()


def test_a_sequence_longer_than_its_blocks_is_refused(tiny) -> None:
    forward = PagedForward(tiny, pools_for(tiny, 4))
    with pytest.raises(ValueError, match="2 blocks cannot hold 9 tokens"):
        forward([Segment(tokens(9, 5), 0, [0, 1])])


def test_runs_merge_consecutive_blocks_up_to_the_sequence_end(tiny) -> None:
    forward = PagedForward(tiny, pools_for(tiny, 40))
    runs = forward._runs(Segment([1], 9, [7, 8, 3, 4, 5, 30]))  # 10 tokens
    assert runs == [(7 * BS, 8), (3 * BS, 2)]
