"""Every code example of the README and of the docs pages below runs as it stands.

Each ```python block runs in its own subprocess, in a scratch folder, with a timeout:

- a block that reads its engine from ``sys.argv`` (the README's quickstarts) runs with
  ``sim``, the virtual-time engine (``tests/live/test_graph.py`` runs them on torch too);
- a block that talks to ``pbkv serve`` at ``http://127.0.0.1:8000/v1`` runs against a
  server this module starts with ``--engine sim`` on a free port, the block's port
  rewritten to it;
- any other block runs as it is.

Bash blocks are not run (they install, or run for minutes), but every ``pbkv`` command in
them, and in inline code spans, must parse: its subcommand, flags and choices exist.

``docs/serve.md``, ``docs/dynamo.md`` and ``docs/trtllm.md`` are left out: their examples
need a configured server, Dynamo or TensorRT-LLM.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
OTHER_PAGES = {"serve.md", "dynamo.md", "trtllm.md"}
PAGES = [ROOT / "README.md"] + sorted(
    p for p in (ROOT / "docs").glob("*.md") if p.name not in OTHER_PAGES
)
SERVER_URL = "http://127.0.0.1:8000/v1"
BLOCK_TIMEOUT_S = 120
SERVER_START_TIMEOUT_S = 90

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"`(pbkv [^`]+)`")
_LISTENING = re.compile(r"on (http://127\.0\.0\.1:\d+)")


class Block(NamedTuple):
    """One fenced code block: where it is, its language and its text."""

    where: str
    language: str
    text: str


def blocks(language: str) -> list[Block]:
    """Return every ``language`` block of :data:`PAGES`, named ``page:line``."""
    found = []
    for page in PAGES:
        source = page.read_text()
        for match in _FENCE.finditer(source):
            if match.group(1) == language:
                line = source.count("\n", 0, match.start()) + 1
                found.append(Block(f"{page.relative_to(ROOT)}:{line}", language, match.group(2)))
    return found


PYTHON = blocks("python")


def test_the_pages_have_examples_to_run():
    assert any(b.where.startswith("README.md") for b in PYTHON)
    assert any(SERVER_URL in b.text for b in PYTHON)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """Start ``pbkv serve --engine sim`` on a free port; yield its base URL."""
    command = [sys.executable, "-m", "pbkv.cli", "serve", "--engine", "sim", "--port", "0"]
    command += ["--served-model-name", "smollm2", "--graceful-timeout-s", "1"]
    server = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = _wait_for_address(server)
        yield f"{url}/v1"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_for_address(server: subprocess.Popen[str]) -> str:
    """Return the URL the server prints once it listens."""
    lines: list[str] = []

    def read() -> None:
        assert server.stdout is not None
        for line in server.stdout:  # read to the end, so the pipe never fills
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline and server.poll() is None:
        for line in list(lines):
            if match := _LISTENING.search(line):
                return match.group(1)
        time.sleep(0.1)
    raise AssertionError(f"pbkv serve did not start:\n{''.join(lines)}")


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_the_python_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest):
    text, argv = block.text, []
    if "sys.argv[1]" in block.text:
        argv = ["sim"]
    if SERVER_URL in text:
        text = text.replace(SERVER_URL, request.getfixturevalue("server_url"))
    script = tmp_path / "block.py"
    script.write_text(text)
    done = subprocess.run(
        [sys.executable, str(script), *argv],
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{block.where} printed nothing"


def commands() -> list[tuple[str, str]]:
    """Return every ``pbkv`` command of the pages' bash blocks and inline code spans."""
    found = []
    for block in blocks("bash"):
        joined = block.text.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            for part in re.split(r"&&|\|\||;", line):
                if part.strip().startswith("pbkv "):
                    found.append((block.where, " ".join(part.split())))
    for page in PAGES:
        for match in _SPAN.finditer(page.read_text()):
            found.append((str(page.relative_to(ROOT)), " ".join(match.group(1).split())))
    return [(where, c) for where, c in found if "--help" not in c]


COMMANDS = commands()


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_the_pbkv_command_parses(where: str, command: str, capsys):
    from pbkv.cli import build_parser

    words = shlex.split(command)[1:]
    if not any(w.startswith("-") for w in words):
        words.append("--help")  # a command named in prose: it exists (exits 0)
    try:
        build_parser().parse_args(words)
    except SystemExit as stop:
        if stop.code != 0 or "--help" not in words:
            pytest.fail(f"{where}: `{command}` does not parse: {capsys.readouterr().err}")


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_relative_links_lead_to_files(page: Path):
    targets = [t for t in _LINK.findall(page.read_text()) if "://" not in t]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"
