"""Bundled multi-agent apps (§8) and the tokenizer their token ids come from.

``get_app(name)`` builds a registered app; ``app.generate(n_workflows, seed)`` returns
workflows with real SmolLM2 token ids. Apps: ``codegen`` (Planner → Coder → Tester with
an Analyzer retry loop), ``hover`` (multi-hop claim verification, 2–4 hops per claim),
``swebench`` (a manager-selected group chat resolving GitHub issues, with tool gaps),
``financebench`` (a static five-agent crew over a 10-K excerpt), ``groupchat`` (a
selector group chat that keeps naming one member), ``toolloop`` (a ReAct-style
assistant looping over two tools, quick or deep by the ticket), ``taubench`` (replay
of the τ-bench airline trajectories) and ``mooncake`` (the Mooncake conversation trace
replayed as unlabeled traffic, open loop).
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
from pbkv.examples.apps import App, app_names, get_app, register_app, validate_path
from pbkv.examples.codegen import (
    MAX_RETRIES,
    CodegenApp,
    CodegenTask,
    failure_probability,
    sample_task,
)
from pbkv.examples.data import BUNDLED_DATA_DIR, DATA_DIR_ENV, find_data_dir, find_data_file
from pbkv.examples.financebench import FinanceBenchApp, FinanceTask
from pbkv.examples.groupchat import GroupChatApp
from pbkv.examples.hover import MAX_REPLANS, HoverApp, HoverTask
from pbkv.examples.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    MOONCAKE_TRACES,
    MooncakeApp,
    MooncakeRequest,
    load_mooncake,
)
from pbkv.examples.swebench import MAX_CODER_TURNS, SwebenchApp, SwebenchTask
from pbkv.examples.taubench import TOOL_LATENCY_S, Episode, TauBenchApp, load_episodes
from pbkv.examples.toolloop import ToolLoopApp

__all__ = [
    "BUNDLED_DATA_DIR",
    "DATA_DIR_ENV",
    "MOONCAKE_BLOCK_TOKENS",
    "MOONCAKE_TRACES",
    "MAX_CODER_TURNS",
    "MAX_REPLANS",
    "MAX_RETRIES",
    "TOOL_LATENCY_S",
    "App",
    "CodegenApp",
    "CodegenTask",
    "Episode",
    "FinanceBenchApp",
    "FinanceTask",
    "GroupChatApp",
    "HoverApp",
    "HoverTask",
    "MooncakeApp",
    "MooncakeRequest",
    "SwebenchApp",
    "SwebenchTask",
    "TauBenchApp",
    "TokenizerUnavailable",
    "ToolLoopApp",
    "app_names",
    "cache_dir",
    "decode",
    "encode",
    "encode_batch",
    "failure_probability",
    "find_data_dir",
    "find_data_file",
    "get_app",
    "load_episodes",
    "load_mooncake",
    "load_tokenizer",
    "register_app",
    "sample_task",
    "smollm2_gguf_path",
    "validate_path",
    "vocab_size",
]
