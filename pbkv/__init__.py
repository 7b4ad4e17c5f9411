"""pbkv: prediction-based KV-cache management for dynamic multi-agent LLM workflows.

Implements PBKV (arXiv 2605.06472). Subpackages: :mod:`pbkv.runtime` (trio actors),
:mod:`pbkv.actors` (workflow, agent, KV-manager, predictor and engine actors),
:mod:`pbkv.kvmanager` (radix tree, policies), :mod:`pbkv.predictor` (forecasters),
:mod:`pbkv.engines` (sim, torch, trtllm) and :mod:`pbkv.examples` (bundled apps).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
