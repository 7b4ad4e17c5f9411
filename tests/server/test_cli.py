"""``pbkv serve`` as a command: options, and a real process on 127.0.0.1 stopped by Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import openai
import pytest

from pbkv.cli import build_parser
from pbkv.server.cli import forecasters


def test_options_parse_and_bad_api_keys_are_refused(capsys):
    args = build_parser().parse_args(
        ["serve", "--engine", "sim", "--port", "0", "--api-key", "k1=acme", "--api-key", "k2=b"]
    )
    assert (args.engine, args.port, args.api_keys) == ("sim", 0, [("k1", "acme"), ("k2", "b")])
    for bad in (["--api-key", "no-tenant"], ["--api-key", "k=a/b"], ["--port", "70000"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", *bad])
    assert "KEY=TENANT" in capsys.readouterr().err


def test_a_predictor_needs_traces_and_none_needs_nothing():
    assert forecasters("none", None, None) == ()
    with pytest.raises(ValueError, match="needs --traces"):
        forecasters("markov", None, None)


def test_serve_runs_until_interrupted():
    """The sim engine starts in about a second (no torch): enough to test the command."""
    command = [sys.executable, "-m", "pbkv.cli", "serve", "--engine", "sim", "--port", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        port = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert port, line
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port.group(1)}/v1",
            api_key="x",
            max_retries=0,
            timeout=30,
        )
        [model] = client.models.list().data
        reply = client.chat.completions.create(
            model=model.id, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.usage.completion_tokens == 4
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert model.id == "sim/qwen3-32b"
    assert proc.returncode == 0
    assert out.strip() == "pbkv serve: stopped"
