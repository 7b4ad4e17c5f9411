"""Block keys: chained, collision-resistant, namespaced (kvmanager/keys.py)."""

import os
import subprocess
import sys

import pytest

from pbkv.kvmanager import block_keys


def test_keys_chain_over_prefix():
    a = block_keys([1, 2, 3, 4, 5], 2)
    b = block_keys([1, 2, 3, 9, 5], 2)
    assert len(a) == 2
    assert a[0] == b[0] and a[1] != b[1]
    assert block_keys([7, 8], 2) != block_keys([1, 2, 7, 8], 2)[1:]
    with pytest.raises(ValueError, match="block_size"):
        block_keys([1], 0)


def test_tokens_whose_python_hashes_collide_get_different_keys():
    # hash(-1) == hash(-2) in CPython: a hash()-chained key shared 32 cached tokens here
    assert hash(-1) == hash(-2)
    a = block_keys([5] * 16 + [-1] * 16 + [9], 16)
    b = block_keys([5] * 16 + [-2] * 16 + [9], 16)
    assert a[0] == b[0] and a[1] != b[1]


def test_equal_tuple_hashes_do_not_collide():
    # (0, x) and (x', y') tuple hashes are easy to collide; the key is over token bytes
    keys = {tuple(block_keys([i, j], 2)) for i in range(-64, 64) for j in range(-64, 64)}
    assert len(keys) == 128 * 128


def test_namespace_is_mixed_in():
    tokens = list(range(8))
    assert block_keys(tokens, 4, namespace="a") != block_keys(tokens, 4, namespace="b")
    assert block_keys(tokens, 4) == block_keys(tokens, 4, namespace="")
    assert block_keys(tokens, 4, namespace="a") == block_keys(tokens, 4, namespace="a")


def test_keys_do_not_depend_on_the_process_hash_seed():
    probe = "from pbkv.kvmanager import block_keys; print(block_keys([1, 2], 2, namespace='t'))"
    runs = {
        subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(runs) == 1
    assert block_keys([1, 2], 2) == block_keys((1, 2), 2)


def test_token_ids_outside_int64_are_refused():
    with pytest.raises(ValueError, match="token id"):
        block_keys([2**63], 1)


def test_known_leading_keys_continue_the_chain():
    tokens = list(range(40))
    prompt_keys = block_keys(tokens[:23], 4, namespace="t")  # 5 full blocks
    assert block_keys(tokens, 4, namespace="t", known=prompt_keys) == block_keys(tokens, 4, "t")
    assert block_keys(tokens[:20], 4, "t", known=prompt_keys) == prompt_keys
    with pytest.raises(ValueError, match="6 known keys for 5 blocks"):
        block_keys(tokens[:20], 4, known=block_keys(tokens[:24], 4))
