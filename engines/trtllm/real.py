"""Bridges to the real ``tensorrt_llm.LLM`` (1.2.x), imported only when called.

**Not run anywhere in this project**: the wheel is not installable on any machine we
have (PyPI carries a placeholder; NVIDIA's wheel needs CUDA 13). Written against the
documented API in ``../shared/reference/trtllm.md``; ``scripts/trtllm_check.py`` is
where it would first run.

The LLM API is asyncio; pbkv's runtime is trio. :class:`ThreadedLLM` crosses over with
worker threads: ``RequestOutput.result()`` and ``get_kv_cache_events(timeout)`` block in
``trio.to_thread``.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import trio


def import_tensorrt_llm() -> Any:
    """Import ``tensorrt_llm``, or raise ``ImportError`` saying why it cannot run here."""
    try:
        return importlib.import_module("tensorrt_llm")
    except Exception as exc:  # it loads C++ bindings and a CUDA driver at import
        raise ImportError(
            f"tensorrt_llm is not importable ({type(exc).__name__}: {exc}); it needs NVIDIA's "
            "wheel (pip install .[trtllm] from NVIDIA's index), CUDA 13 and a GPU"
        ) from exc


class _Output:
    def __init__(self, output: Any) -> None:
        self._output = output

    async def aresult(self) -> Any:
        return await trio.to_thread.run_sync(self._output.result)


class ThreadedLLM:
    """Wrap a ``tensorrt_llm.LLM`` so the trio adapter can call it.

    ``generate_async`` keeps the wrapped signature's keywords (so the adapter's
    signature detection sees the real optional arguments).
    """

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self.generate_async = self._make_generate(llm.generate_async)

    @staticmethod
    def _make_generate(real: Any) -> Any:
        import functools

        @functools.wraps(real)
        def generate_async(
            inputs: Sequence[int], sampling_params: Any = None, **kwargs: Any
        ) -> Any:
            return _Output(real(list(inputs), sampling_params, **kwargs))

        return generate_async

    async def get_kv_cache_events_async(self, timeout: float = 2) -> AsyncIterator[dict[str, Any]]:
        events = await trio.to_thread.run_sync(self._llm.get_kv_cache_events, timeout)
        for event in events:
            yield event


def block_key_hasher(prompt: Sequence[int], tokens_per_block: int, salt: str = "") -> list[int]:
    """The engine's own block hashes of a prompt's reusable blocks, via the internal
    ``BlockKeyHasher`` (reference notes §3.2). Unverified; the cache salt is not passed
    (its binding argument is not documented), so salted prompts will not match."""
    bm = importlib.import_module("tensorrt_llm.bindings.internal.batch_manager")
    hashes: list[int] = []
    parent = 0
    usable = len(prompt) - 1
    for start in range(0, usable - usable % tokens_per_block, tokens_per_block):
        key = bm.BlockKey(list(prompt[start : start + tokens_per_block]))
        parent = bm.BlockKeyHasher.hash(key, parent)
        hashes.append(parent)
    return hashes
