"""TensorRT-LLM engine-owned cache: adapter, event mirror, steering, and a faithful fake
of the 1.2 block manager (§7.3).

Importing this package never imports ``tensorrt_llm`` (see :mod:`.real`), and nothing
else in pbkv imports this package at module import time.
"""

from pbkv.engines.trtllm.api import KvCacheRetentionConfig, SamplingParams, load_api
from pbkv.engines.trtllm.blockkey import block_key_hash, cache_salt_id, prompt_block_hashes
from pbkv.engines.trtllm.engine import TrtllmEngine, TrtllmEngineConfig, TrtllmStatistics
from pbkv.engines.trtllm.events import poll_kv_events
from pbkv.engines.trtllm.fake import BlockManagerConfig, FakeBlockManager, block_hash
from pbkv.engines.trtllm.mirror import Mirror, MirrorBlock, MirrorStatistics
from pbkv.engines.trtllm.simllm import SimLLM, SimLLMConfig, SimLLMStatistics
from pbkv.engines.trtllm.steering import Bands, MirrorKV, Touch, retention_config

__all__ = [
    "Bands",
    "BlockManagerConfig",
    "FakeBlockManager",
    "KvCacheRetentionConfig",
    "Mirror",
    "MirrorBlock",
    "MirrorKV",
    "MirrorStatistics",
    "SamplingParams",
    "SimLLM",
    "SimLLMConfig",
    "SimLLMStatistics",
    "Touch",
    "TrtllmEngine",
    "TrtllmEngineConfig",
    "TrtllmStatistics",
    "block_hash",
    "block_key_hash",
    "cache_salt_id",
    "load_api",
    "poll_kv_events",
    "prompt_block_hashes",
    "retention_config",
]
