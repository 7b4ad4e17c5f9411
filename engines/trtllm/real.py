"""Bridges to the real ``tensorrt_llm.LLM`` (1.2.x), imported only when called.

**Not run anywhere in this project yet**: the wheel is not installable on any machine we
have (PyPI carries a placeholder; NVIDIA's wheel needs CUDA 13 and pins its own torch).
Written against the 1.1/1.2-era source (``tensorrt_llm/llmapi/llm.py``,
``executor/executor.py``, ``executor/result.py``, ``_utils.py``; see
``docs/trtllm.md``); ``scripts/trtllm_check.py`` is where it first runs.

The LLM API is asyncio; pbkv's runtime is trio. :class:`ThreadedLLM` crosses over
without an asyncio loop: ``generate_async`` is called on the trio thread (it only
enqueues; with no running asyncio loop its results and the KV-event queue are plain
thread-safe queues), ``RequestOutput.result()`` blocks in ``trio.to_thread``, and KV
events are read without blocking by :func:`pbkv.engines.trtllm.events.poll_kv_events`
through ``_executor`` and ``get_kv_cache_events``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Sequence
from typing import Any

import trio

from pbkv.engines.trtllm.api import Api, load_api

log = logging.getLogger(__name__)


def import_tensorrt_llm() -> Any:
    """Import ``tensorrt_llm``, or raise ``ImportError`` saying why it cannot run here."""
    try:
        return importlib.import_module("tensorrt_llm")
    except Exception as exc:  # it loads C++ bindings and a CUDA driver at import
        raise ImportError(
            f"tensorrt_llm is not importable ({type(exc).__name__}: {exc}); it needs "
            "NVIDIA's TensorRT-LLM 1.2 container (or its own environment), CUDA 13 and a "
            "GPU: see docs/trtllm.md"
        ) from exc


class _Output:
    def __init__(self, output: Any) -> None:
        self._output = output

    async def aresult(self) -> Any:
        return await trio.to_thread.run_sync(self._output.result)


class ThreadedLLM:
    """Wrap a ``tensorrt_llm.LLM`` so the trio adapter can call it.

    ``generate_async`` keeps the wrapped signature's keywords (so the adapter's
    signature detection sees the real optional arguments). ``request_api`` holds the
    real ``SamplingParams``/``KvCacheRetentionConfig`` (``LLM.generate_async`` refuses
    any other ``SamplingParams`` with ``TypeError``).

    Args:
        llm: the ``tensorrt_llm.LLM``.
        api: request classes; default the installed ``tensorrt_llm``'s.

    Raises:
        ValueError: ``llm`` was built with KV events off (``KvCacheConfig``'s
            ``event_buffer_max_size`` is 0, upstream's default, or block reuse is off):
            pbkv's mirror of the block manager would stay empty. Read from ``llm.args``
            (``tensorrt_llm/llmapi/llm.py``) where the LLM has it.
    """

    def __init__(self, llm: Any, api: Api | None = None) -> None:
        kv_config = getattr(getattr(llm, "args", None), "kv_cache_config", None)
        if kv_config is not None and (
            getattr(kv_config, "event_buffer_max_size", 1) == 0
            or getattr(kv_config, "enable_block_reuse", True) is False
        ):
            raise ValueError(
                "the LLM's KV events are off: build it with "
                "KvCacheConfig(enable_block_reuse=True, event_buffer_max_size=N > 0) "
                "(pbkv mirrors the block manager from them)"
            )
        self._llm = llm
        self.request_api = api or load_api(real=True)
        self.generate_async = self._make_generate(llm.generate_async)

    @staticmethod
    def _make_generate(real: Any) -> Any:
        @functools.wraps(real)
        def generate_async(
            inputs: Sequence[int], sampling_params: Any = None, **kwargs: Any
        ) -> Any:
            return _Output(real(list(inputs), sampling_params, **kwargs))

        return generate_async

    @property
    def _executor(self) -> Any:
        """The engine's executor, where its KV-event queue lives."""
        return getattr(self._llm, "_executor", None)

    def get_kv_cache_events(self, timeout: float = 2) -> list[dict[str, Any]]:
        """``LLM.get_kv_cache_events``: blocks up to ``timeout`` after the last event;
        the adapter calls it with 0 after lifting the queue's done latch."""
        return list(self._llm.get_kv_cache_events(timeout=timeout))


def block_key_hasher(prompt: Sequence[int], tokens_per_block: int, salt: str = "") -> list[int]:
    """The engine's own hashes of a prompt's reusable full blocks, from its binding
    (``tensorrt_llm.bindings.internal.batch_manager.BlockKeyHasher``), as upstream's
    ``tensorrt_llm/serve/router.py`` computes them.

    For checking the port (:func:`pbkv.engines.trtllm.blockkey.prompt_block_hashes`,
    which the adapter uses) on a machine with TensorRT-LLM: the binding's ``BlockKey``
    takes no cache salt, so a salted prompt raises.

    Raises:
        ValueError: a non-empty ``salt``.
    """
    if salt:
        raise ValueError("the BlockKey binding takes no cache salt; use blockkey's port")
    bm = importlib.import_module("tensorrt_llm.bindings.internal.batch_manager")
    hashes: list[int] = []
    parent = 0
    usable = len(prompt) - 1
    for start in range(0, usable - usable % tokens_per_block, tokens_per_block):
        key = bm.BlockKey(list(prompt[start : start + tokens_per_block]))
        parent = bm.BlockKeyHasher.hash(key, parent)
        hashes.append(parent)
    return hashes


def serializer_handles_none() -> bool:
    """Whether the installed ``KVCacheEventSerializer`` survives an ``updated`` event
    with a None field (``tensorrt_llm/_utils.py::_event_diff_to_json``; the late-2025
    version raises ``AttributeError``, fixed upstream 2026-02)."""
    serializer = importlib.import_module("tensorrt_llm._utils").KVCacheEventSerializer
    try:
        serializer._event_diff_to_json(None)
    except AttributeError:
        return False
    return True


def guard_event_serializer() -> bool:
    """Make the installed serializer turn a None diff into ``None``, if it does not.

    Only reaches a worker in this process (``TLLM_WORKER_USE_SINGLE_PROCESS=1`` before
    the ``LLM`` is built); a spawned MPI worker imports its own copy. Returns whether a
    patch was applied.
    """
    if serializer_handles_none():
        return False
    serializer = importlib.import_module("tensorrt_llm._utils").KVCacheEventSerializer
    original = inspect.getattr_static(serializer, "_event_diff_to_json").__func__

    def _event_diff_to_json(data: Any) -> Any:
        return None if data is None else original(data)

    serializer._event_diff_to_json = staticmethod(_event_diff_to_json)
    log.warning("patched KVCacheEventSerializer._event_diff_to_json to accept None")
    return True
