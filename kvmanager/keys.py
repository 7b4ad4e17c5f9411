"""Block keys: the identity of each full block of a prompt, chained over its prefix.

Two prompts share a block key exactly when they share every token up to the end of
that block (as vLLM's prefix-caching block hashes do), so the radix tree matches on
integer keys instead of token lists. Only full blocks have keys; a partial tail block is
never cached.
"""

from __future__ import annotations

from collections.abc import Sequence


def block_keys(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Return one chained key per full block of ``token_ids``.

    Args:
        token_ids: the prompt (or prompt + output) token ids.
        block_size: tokens per KV block, > 0.

    Returns:
        ``len(token_ids) // block_size`` ints; key ``i`` depends on tokens
        ``[0, (i+1) * block_size)``.

    Raises:
        ValueError: ``block_size`` is not positive.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    tokens = tuple(token_ids)
    keys: list[int] = []
    key = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        key = hash((key, tokens[start : start + block_size]))
        keys.append(key)
    return keys
