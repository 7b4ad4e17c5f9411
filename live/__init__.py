"""pbkv.live: the runtime agent apps embed (DESIGN §1, §4).

Sessions (:func:`open_runtime`, :class:`WorkflowSession`) are the base: open a workflow
per task and call agents with real prompts. The graph API (:class:`App`) declares agents,
tools and routers on top of them, and its call graph feeds the predictor.
"""

from .build import BuiltEngine, RuntimeConfig, build_engine, open_runtime
from .call import CallFailed, Delta, Overloaded, Reply, ReplyStream
from .chat import ChatFormat, PromptTooLong
from .driver import replay_workflow, run_workflow, serve_app, serve_replays
from .dry_run import simulate_workflow
from .errors import NodeFailed
from .graph import END, START, App, LiveTask, State, TokenPrompt, ToolResult, Turn
from .session import Runtime, RuntimeStatistics
from .simulated import Simulated
from .workflow import WorkflowEnded, WorkflowSession

__all__ = [
    "END",
    "START",
    "App",
    "BuiltEngine",
    "CallFailed",
    "ChatFormat",
    "Delta",
    "LiveTask",
    "NodeFailed",
    "Overloaded",
    "PromptTooLong",
    "Reply",
    "ReplyStream",
    "Runtime",
    "RuntimeConfig",
    "RuntimeStatistics",
    "Simulated",
    "State",
    "TokenPrompt",
    "ToolResult",
    "Turn",
    "WorkflowEnded",
    "WorkflowSession",
    "build_engine",
    "open_runtime",
    "replay_workflow",
    "run_workflow",
    "serve_app",
    "serve_replays",
    "simulate_workflow",
]
