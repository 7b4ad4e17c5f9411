"""SmolLM2's tokenizer for the bundled apps: re-exported from :mod:`pbkv.assets`.

Kept while the apps being ported onto the graph API (issue 10) still import it here;
new code imports :mod:`pbkv.assets`.
"""

from pbkv.assets import (
    TokenizerUnavailable,
    cache_dir,
    decode,
    encode,
    encode_batch,
    load_tokenizer,
    smollm2_gguf_path,
    vocab_size,
)

__all__ = [
    "TokenizerUnavailable",
    "cache_dir",
    "decode",
    "encode",
    "encode_batch",
    "load_tokenizer",
    "smollm2_gguf_path",
    "vocab_size",
]
