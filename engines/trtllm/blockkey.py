"""TensorRT-LLM 1.2's block-key hash, ported: the hashes its KV events carry.

The engine names every radix-tree block by a 64-bit hash chained over the prefix
(``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp::BlockKeyHasher::hash``; the same
function is ``hash_v1_block_key`` in ``tensorrt_llm/serve/router.py``-era Python on 2026
main). Per block:

- the seed is ``len(tokens) XOR parent_hash * 0xbf58476d1ce4e5b9`` (64-bit);
- the request's **cache salt id** is mixed in only when ``parent_hash == 0`` (the
  sequence's first block), so a salted prompt differs from its first block on and
  tenants never share a block;
- each token id is mixed as a 32-bit value (the combine's ``a + 0x9e3779b9`` wraps at
  32 bits, as in C++, before the 64-bit terms are added);
- a LoRA task id, when present, is mixed last.

The salt id is ``blake3(salt)``'s first 8 bytes, little-endian
(``tensorrt_llm/inputs/utils.py::get_cache_salt_id``). Token extra ids and multimodal
extra keys (not used by text prompts) are not ported.

The fake block manager and the mirror both use these hashes, so hashes pbkv predicts
for a prompt are the ones the real engine's events carry.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from pbkv.engines.trtllm.blake3 import blake3_digest

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
_MIX32 = 0x45D9F3B
_MIX64_A = 0xBF58476D1CE4E5B9
_MIX64_B = 0x94D049BB133111EB
_GOLDEN = 0x9E3779B9


def _mix32(value: int, seed: int) -> int:
    a = value & _U32
    a = (((a >> 16) ^ a) * _MIX32) & _U32
    a = (((a >> 16) ^ a) * _MIX32) & _U32
    a = (a >> 16) ^ a
    a = (a + _GOLDEN) & _U32  # uint32_t + unsigned literal wraps at 32 bits
    return seed ^ ((a + ((seed << 6) & _U64) + (seed >> 2)) & _U64)


def _mix64(value: int, seed: int) -> int:
    c = value & _U64
    c = ((c ^ (c >> 30)) * _MIX64_A) & _U64
    c = ((c ^ (c >> 27)) * _MIX64_B) & _U64
    c ^= c >> 31
    return seed ^ ((c + _GOLDEN + ((seed << 6) & _U64) + (seed >> 2)) & _U64)


def block_key_hash(
    tokens: Sequence[int],
    parent_hash: int = 0,
    cache_salt_id: int | None = None,
    lora_task_id: int | None = None,
) -> int:
    """Return the engine's hash of one block key under ``parent_hash`` (0 at the root).

    Args:
        tokens: the block's token ids (a full block, or a trailing partial one).
        parent_hash: the previous block's hash; 0 for the sequence's first block.
        cache_salt_id: :func:`cache_salt_id` of the request's salt, or ``None``.
        lora_task_id: the request's LoRA task id, or ``None``.

    Returns:
        An unsigned 64-bit int, as the events' ``block_hash`` fields carry it.
    """
    seed = (len(tokens) ^ ((parent_hash * _MIX64_A) & _U64)) & _U64
    if parent_hash == 0 and cache_salt_id is not None:
        seed = _mix64(cache_salt_id, seed)
    for token in tokens:
        seed = _mix32(token, seed)
    if lora_task_id is not None:
        seed = _mix64(lora_task_id, seed)
    return seed


@functools.lru_cache(maxsize=4096)
def cache_salt_id(cache_salt: str | None) -> int | None:
    """Return the 64-bit id TensorRT-LLM derives from a cache salt (``None`` for none).

    ``tensorrt_llm/inputs/utils.py::get_cache_salt_id``: BLAKE3 of the UTF-8 salt, first
    8 bytes little-endian. pbkv sends no salt for an empty namespace, so ``""`` has none.
    """
    if not cache_salt:
        return None
    return int.from_bytes(blake3_digest(cache_salt.encode("utf-8"), 8), "little")


def prompt_block_hashes(
    prompt_token_ids: Sequence[int], tokens_per_block: int, cache_salt: str = ""
) -> list[int]:
    """Return the hashes of a prompt's reusable full blocks, root first.

    The engine keys the prompt minus its **last token** (whose KV state is not kept,
    ``WindowBlockManager::addSequence``); only full blocks are listed (a trailing
    partial block is matched partially, never by hash).

    Raises:
        ValueError: ``tokens_per_block < 1``.
    """
    if tokens_per_block < 1:
        raise ValueError(f"tokens_per_block must be >= 1, got {tokens_per_block}")
    salt = cache_salt_id(cache_salt)
    usable = len(prompt_token_ids) - 1
    hashes: list[int] = []
    parent = 0
    for start in range(0, usable - usable % tokens_per_block, tokens_per_block):
        parent = block_key_hash(prompt_token_ids[start : start + tokens_per_block], parent, salt)
        hashes.append(parent)
    return hashes
