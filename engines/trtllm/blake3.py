"""BLAKE3 in plain Python: the hash TensorRT-LLM turns a cache salt into a 64-bit id.

TensorRT-LLM hashes a request's ``cache_salt`` with BLAKE3 and keeps the first 8 bytes,
little-endian (``tensorrt_llm/inputs/utils.py::get_cache_salt_id``); that id enters the
first block's key hash. The ``blake3`` wheel is not a pbkv dependency, so this module
computes the same digest from the BLAKE3 specification (hash mode, any input length,
any output length). It is slow (tens of microseconds per short salt) and the adapter
caches salt ids, so speed does not matter. Verified against the specification's test
vectors in ``tests/engines/trtllm/test_blockkey.py``.
"""

from __future__ import annotations

_MASK = 0xFFFFFFFF
_IV = (
    0x6A09E667,
    0xBB67AE85,
    0x3C6EF372,
    0xA54FF53A,
    0x510E527F,
    0x9B05688C,
    0x1F83D9AB,
    0x5BE0CD19,
)
_PERMUTATION = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
_BLOCK_LEN = 64
_CHUNK_LEN = 1024
_CHUNK_START, _CHUNK_END, _PARENT, _ROOT = 1, 2, 4, 8


def _g(s: list[int], a: int, b: int, c: int, d: int, x: int, y: int) -> None:
    s[a] = (s[a] + s[b] + x) & _MASK
    s[d] ^= s[a]
    s[d] = ((s[d] >> 16) | (s[d] << 16)) & _MASK
    s[c] = (s[c] + s[d]) & _MASK
    s[b] ^= s[c]
    s[b] = ((s[b] >> 12) | (s[b] << 20)) & _MASK
    s[a] = (s[a] + s[b] + y) & _MASK
    s[d] ^= s[a]
    s[d] = ((s[d] >> 8) | (s[d] << 24)) & _MASK
    s[c] = (s[c] + s[d]) & _MASK
    s[b] ^= s[c]
    s[b] = ((s[b] >> 7) | (s[b] << 25)) & _MASK


def _compress(cv: tuple[int, ...], words: list[int], counter: int, length: int, flags: int):
    """Return the 16 output words of one compression (spec §2.2)."""
    s = [*cv, *_IV[:4], counter & _MASK, (counter >> 32) & _MASK, length, flags]
    m = list(words)
    for round_ in range(7):
        _g(s, 0, 4, 8, 12, m[0], m[1])
        _g(s, 1, 5, 9, 13, m[2], m[3])
        _g(s, 2, 6, 10, 14, m[4], m[5])
        _g(s, 3, 7, 11, 15, m[6], m[7])
        _g(s, 0, 5, 10, 15, m[8], m[9])
        _g(s, 1, 6, 11, 12, m[10], m[11])
        _g(s, 2, 7, 8, 13, m[12], m[13])
        _g(s, 3, 4, 9, 14, m[14], m[15])
        if round_ < 6:
            m = [m[i] for i in _PERMUTATION]
    return [s[i] ^ s[i + 8] for i in range(8)] + [s[i + 8] ^ cv[i] for i in range(8)]


def _words(block: bytes) -> list[int]:
    padded = block.ljust(_BLOCK_LEN, b"\0")
    return [int.from_bytes(padded[i : i + 4], "little") for i in range(0, _BLOCK_LEN, 4)]


class _Output:
    """The inputs of a node's last compression, kept so the root can be re-run per
    output block (extendable output)."""

    def __init__(self, cv: tuple[int, ...], words: list[int], counter: int, length: int, flags):
        self.cv, self.words, self.counter, self.length, self.flags = (
            cv,
            words,
            counter,
            length,
            flags,
        )

    def chaining_value(self) -> tuple[int, ...]:
        return tuple(_compress(self.cv, self.words, self.counter, self.length, self.flags)[:8])

    def root_bytes(self, n: int) -> bytes:
        out = bytearray()
        block = 0
        while len(out) < n:
            words = _compress(self.cv, self.words, block, self.length, self.flags | _ROOT)
            out += b"".join(w.to_bytes(4, "little") for w in words)
            block += 1
        return bytes(out[:n])


def _chunk_output(chunk: bytes, index: int) -> _Output:
    cv = _IV
    blocks = [chunk[i : i + _BLOCK_LEN] for i in range(0, len(chunk), _BLOCK_LEN)] or [b""]
    for i, block in enumerate(blocks):
        flags = _CHUNK_START if i == 0 else 0
        if i == len(blocks) - 1:
            return _Output(cv, _words(block), index, len(block), flags | _CHUNK_END)
        cv = tuple(_compress(cv, _words(block), index, _BLOCK_LEN, flags)[:8])
    raise AssertionError("unreachable")


def _parent_output(left: tuple[int, ...], right: tuple[int, ...]) -> _Output:
    return _Output(_IV, [*left, *right], 0, _BLOCK_LEN, _PARENT)


def blake3_digest(data: bytes, length: int = 32) -> bytes:
    """Return the BLAKE3 hash of ``data`` (unkeyed), ``length`` bytes long.

    Args:
        data: the input bytes.
        length: output bytes (BLAKE3 is extendable; the first 32 are the usual hash).

    Raises:
        ValueError: ``length < 1``.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    chunks = [data[i : i + _CHUNK_LEN] for i in range(0, len(data), _CHUNK_LEN)] or [b""]
    stack: list[tuple[int, ...]] = []
    for index, chunk in enumerate(chunks[:-1]):
        cv = _chunk_output(chunk, index).chaining_value()
        total = index + 1
        while total & 1 == 0:  # merge completed subtrees (spec §5.1.2)
            cv = _parent_output(stack.pop(), cv).chaining_value()
            total >>= 1
        stack.append(cv)
    output = _chunk_output(chunks[-1], len(chunks) - 1)
    while stack:
        output = _parent_output(stack.pop(), output.chaining_value())
    return output.root_bytes(length)
