"""pbkv: prediction-based KV-cache management for dynamic multi-agent LLM workflows.

Implements PBKV (arXiv 2605.06472). The live runtime an app embeds is re-exported here
(:func:`open_runtime`, :class:`WorkflowSession`, see :mod:`pbkv.live`). Subpackages:
:mod:`pbkv.runtime` (trio actors), :mod:`pbkv.actors` (workflow, agent, KV-manager,
predictor and engine actors), :mod:`pbkv.kvmanager` (radix tree, policies),
:mod:`pbkv.predictor` (forecasters), :mod:`pbkv.engines` (sim, torch) and
:mod:`pbkv.examples` (bundled apps).
"""

from pbkv.actors.workload import Segment
from pbkv.engines.base import EngineError, Sampling
from pbkv.live import (
    END,
    START,
    App,
    CallFailed,
    ChatFormat,
    Delta,
    LiveTask,
    NodeFailed,
    Overloaded,
    PromptTooLong,
    Reply,
    Runtime,
    RuntimeConfig,
    Simulated,
    TokenPrompt,
    WorkflowEnded,
    WorkflowSession,
    open_runtime,
    run_workflow,
    serve_app,
)
from pbkv.live.entry import run

__version__ = "0.1.0"
__all__ = [
    "END",
    "START",
    "App",
    "CallFailed",
    "ChatFormat",
    "Delta",
    "EngineError",
    "LiveTask",
    "NodeFailed",
    "Overloaded",
    "PromptTooLong",
    "Reply",
    "Runtime",
    "RuntimeConfig",
    "Sampling",
    "Segment",
    "Simulated",
    "TokenPrompt",
    "WorkflowEnded",
    "WorkflowSession",
    "__version__",
    "open_runtime",
    "run",
    "run_workflow",
    "serve_app",
]
