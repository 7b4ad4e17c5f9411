"""The block-key hash port (``kvCacheManager.cpp::BlockKeyHasher::hash``) and the salt id
(``tensorrt_llm/inputs/utils.py::get_cache_salt_id``, BLAKE3)."""

from __future__ import annotations

import numpy as np
import pytest

from pbkv.engines.trtllm.blake3 import blake3_digest
from pbkv.engines.trtllm.blockkey import block_key_hash, cache_salt_id, prompt_block_hashes

# BLAKE3's published test vectors: input byte i is i % 251.
VECTORS = {
    0: "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
    1024: "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7",
    1025: "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444",
}


@pytest.mark.parametrize("length", sorted(VECTORS))
def test_blake3_matches_the_specifications_vectors(length):
    data = bytes(i % 251 for i in range(length))
    assert blake3_digest(data).hex() == VECTORS[length]


def test_blake3_of_several_chunks_and_extended_output():
    """5,000 bytes (a 3-level tree) and 100 output bytes, as the reference ``blake3`` gives."""
    data = bytes(i % 251 for i in range(5000))
    assert blake3_digest(data).hex().startswith("ee78d92070de3df1")
    assert blake3_digest(data, 100).hex().endswith("8c39a4c473877051")
    assert blake3_digest(b"abc", 8).hex() == "6437b3ac38465133"


def test_the_salt_id_is_blake3s_first_eight_bytes_little_endian():
    assert cache_salt_id("abc") == int.from_bytes(bytes.fromhex("6437b3ac38465133"), "little")
    assert cache_salt_id("") is None and cache_salt_id(None) is None


def _cpp_hash(tokens, parent, salt):
    """BlockKeyHasher::hash in fixed-width numpy integers, as C++ computes it."""
    u32, u64 = np.uint32, np.uint64
    with np.errstate(over="ignore"):
        seed = u64(len(tokens)) ^ (u64(parent) * u64(0xBF58476D1CE4E5B9))

        def mix64(c, seed):
            c = u64(c)
            c = (c ^ (c >> u64(30))) * u64(0xBF58476D1CE4E5B9)
            c = (c ^ (c >> u64(27))) * u64(0x94D049BB133111EB)
            c = c ^ (c >> u64(31))
            return seed ^ (c + u64(0x9E3779B9) + (seed << u64(6)) + (seed >> u64(2)))

        if parent == 0 and salt is not None:
            seed = mix64(salt, seed)
        for t in tokens:
            a = u32(t & 0xFFFFFFFF)
            a = ((a >> u32(16)) ^ a) * u32(0x45D9F3B)
            a = ((a >> u32(16)) ^ a) * u32(0x45D9F3B)
            a = (a >> u32(16)) ^ a
            combined = u64(a + u32(0x9E3779B9)) + (seed << u64(6)) + (seed >> u64(2))
            seed = seed ^ combined
    return int(seed)


@pytest.mark.parametrize(
    ("tokens", "parent", "salt"),
    [
        ((1, 2, 3, 4), 0, None),
        ((49151, 0, 7, 2**31 - 1), 0, cache_salt_id("tenant")),
        ((5, 6), 0xDEADBEEFCAFEF00D, cache_salt_id("tenant")),  # salt ignored below the root
        ((0xFFFFFFFF, 0x9E3779B9), 12345, None),  # the 32-bit wrap of a + 0x9e3779b9
    ],
)
def test_the_hash_port_matches_fixed_width_arithmetic(tokens, parent, salt):
    """kvCacheManager.cpp::BlockKeyHasher::hash: uint64 seed, uint32 token mix."""
    assert block_key_hash(tokens, parent, salt) == _cpp_hash(tokens, parent, salt)


def test_prompt_hashes_chain_full_blocks_of_all_but_the_last_token():
    """WindowBlockManager::addSequence: the last prompt token is not keyed."""
    p = list(range(100, 109))  # 8 usable tokens: 2 full blocks
    h = prompt_block_hashes(p, 4, "s")
    salt = cache_salt_id("s")
    assert h == [block_key_hash(p[:4], 0, salt), block_key_hash(p[4:8], h[0], salt)]
    assert prompt_block_hashes(p[:8], 4) == prompt_block_hashes(p[:8], 4, "")[:1]
    with pytest.raises(ValueError):
        prompt_block_hashes(p, 0)
