"""The ``torch`` engine: a transformers causal LM over paged KV under pbkv's control (§7.2).

Importing this package imports torch and transformers; ``import pbkv.engines`` does not.
"""

from pbkv.engines.torchengine.engine import (
    TorchEngine,
    TorchEngineConfig,
    TorchStatistics,
    make_kv_config,
)
from pbkv.engines.torchengine.forward import PagedForward, Segment
from pbkv.engines.torchengine.measure import (
    DecodeComparison,
    HitSaving,
    StepTimes,
    decode_comparison,
    hit_saving,
    prefill_tokens_per_s,
    reload_bytes_per_s,
)
from pbkv.engines.torchengine.model import (
    MODEL_NAMES,
    KVLayout,
    default_device,
    default_dtype,
    load_model,
    smollm2_checkpoint,
    tiny_config,
)
from pbkv.engines.torchengine.pool import BlockCopy, CopyDone, PagedKVPools
from pbkv.engines.torchengine.stepcost import StepCosts

__all__ = [
    "MODEL_NAMES",
    "BlockCopy",
    "CopyDone",
    "DecodeComparison",
    "HitSaving",
    "KVLayout",
    "PagedForward",
    "PagedKVPools",
    "Segment",
    "StepCosts",
    "StepTimes",
    "TorchEngine",
    "TorchEngineConfig",
    "TorchStatistics",
    "decode_comparison",
    "default_device",
    "default_dtype",
    "hit_saving",
    "load_model",
    "make_kv_config",
    "prefill_tokens_per_s",
    "reload_bytes_per_s",
    "smollm2_checkpoint",
    "tiny_config",
]
