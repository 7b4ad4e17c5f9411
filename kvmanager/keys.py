"""Block keys: the identity of each full block of a prompt, chained over its prefix.

Two prompts share a block key exactly when they share every token up to the end of
that block (as vLLM's prefix-caching block hashes do), so the radix tree matches on
integer keys instead of token lists. Only full blocks have keys; a partial tail block is
never cached.

Each key is a 128-bit BLAKE2b digest of the previous key and the block's token ids as
little-endian int64 bytes, the chain seeded with the namespace (tenant / cache salt), as
vLLM moved from Python's ``hash()`` to SHA-256 of the parent hash and the block's tokens.
Python's ``hash()`` collides on purpose-built inputs (``hash(-1) == hash(-2)``), and a
collision would hand one prompt another's KV; a cryptographic digest does not, and its
keys are the same in every process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

_DIGEST_BYTES = 16


def block_keys(
    token_ids: Sequence[int],
    block_size: int,
    namespace: str = "",
    *,
    known: Sequence[int] = (),
) -> list[int]:
    """Return one chained key per full block of ``token_ids``.

    Args:
        token_ids: the prompt (or prompt + output) token ids, each fitting int64.
        block_size: tokens per KV block, > 0.
        namespace: tenant / cache salt mixed into every key (the radix tree also keeps
            namespaces apart; this keeps keys apart wherever they travel).
        known: keys already computed for the leading blocks of ``token_ids`` (with the
            same namespace), e.g. the prompt's when keying prompt + output; only the
            blocks after them are hashed.

    Returns:
        ``len(token_ids) // block_size`` non-negative ints below ``2**128``; key ``i``
        depends on the namespace and tokens ``[0, (i+1) * block_size)``.

    Raises:
        ValueError: ``block_size`` is not positive, a token id does not fit int64, or
            ``known`` has more keys than ``token_ids`` has blocks.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    n_blocks = len(token_ids) // block_size
    if len(known) > n_blocks:
        raise ValueError(f"{len(known)} known keys for {n_blocks} blocks")
    start = len(known) * block_size
    try:
        data = np.asarray(token_ids[start : n_blocks * block_size], dtype="<i8").tobytes()
    except OverflowError as exc:
        raise ValueError(f"a token id does not fit int64: {exc}") from exc
    if known:
        parent = int(known[-1]).to_bytes(_DIGEST_BYTES, "little")
    else:
        parent = hashlib.blake2b(namespace.encode(), digest_size=_DIGEST_BYTES).digest()
    keys = list(known)
    step = block_size * 8
    for offset in range(0, len(data), step):
        parent = hashlib.blake2b(parent + data[offset : offset + step], digest_size=16).digest()
        keys.append(int.from_bytes(parent, "little"))
    return keys
