"""The harness of ``scripts/load_and_fault.py``: a ``pbkv serve --engine sim`` subprocess
on 127.0.0.1, clients of one protocol each (HTTP/1.1, or HTTP/2 by prior knowledge), and
every request's outcome judged and tallied.

A request is counted once: ``completed`` (2xx, a stream ending in ``[DONE]``), ``refused``
(an OpenAI error body, or a stream's error event then ``[DONE]``), ``lost`` (no answer, a
cut stream, a 5xx without an error body) or ``hang`` (no answer within
:data:`CLIENT_TIMEOUT_S`). A server that exits before it is asked to, or with a non-zero
status, counts as a crash; one not gone within its limit after a signal, as a hang.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import httpx

HOST = "127.0.0.1"
MODEL = "sim/qwen3-32b"
CLIENT_TIMEOUT_S = 60.0


class Outcome(NamedTuple):
    """What one request got: ``kind`` (completed, refused, lost, hang), its status, and
    the workflow id the server named (``x-pbkv-workflow-id``)."""

    kind: str
    status: int
    detail: str = ""
    workflow_id: str = ""
    protocol: str = "HTTP/1.1"


@dataclass
class Tally:
    """Counts of one phase (or all of them)."""

    sent: int = 0
    completed: int = 0
    refused: int = 0
    lost: int = 0
    hangs: int = 0
    crashes: int = 0
    cross_tenant_leaks: int = 0
    unexpected: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    ids_by_tenant: dict[str, set[str]] = field(default_factory=dict, repr=False)
    by_protocol: dict[str, dict[str, int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, outcome: Outcome) -> Outcome:
        with self._lock:
            self.sent += 1
            setattr(self, _FIELD[outcome.kind], getattr(self, _FIELD[outcome.kind]) + 1)
            counts = self.by_protocol.setdefault(outcome.protocol, dict.fromkeys(KINDS, 0))
            counts["sent"] += 1
            counts[_FIELD[outcome.kind]] += 1
        return outcome

    def expect(self, name: str, outcome: Outcome, *statuses: int) -> Outcome:
        """Count ``outcome`` and list it as unexpected unless its status is one of
        ``statuses``."""
        self.count(outcome)
        if outcome.status not in statuses:
            with self._lock:
                self.unexpected.append(f"{name}: got {outcome.status} {outcome.detail}")
        return outcome

    def keep_workflow_id(self, tenant: str, workflow_id: str) -> None:
        """Keep a workflow id the server named for ``tenant`` (the cross-tenant checks)."""
        with self._lock:
            self.ids_by_tenant.setdefault(tenant, set()).add(workflow_id)

    def leak(self, what: str) -> None:
        with self._lock:
            self.cross_tenant_leaks += 1
            self.unexpected.append(f"cross-tenant leak: {what}")

    def figures(self) -> dict[str, Any]:
        names = (*COUNTERS, "unexpected", "notes", "by_protocol")
        return {name: getattr(self, name) for name in names}


_FIELD = {"completed": "completed", "refused": "refused", "lost": "lost", "hang": "hangs"}
KINDS = ("sent", "completed", "refused", "lost", "hangs")
COUNTERS = (*KINDS, "crashes", "cross_tenant_leaks")
"""The counts of a :class:`Tally`, in the report's order."""


class Served:
    """One ``pbkv serve --engine sim`` subprocess on 127.0.0.1."""

    def __init__(self, *flags: str) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (as long as the server)
        command = [sys.executable, "-m", "pbkv.cli", "serve", "--engine", "sim"]
        command += ["--host", HOST, "--port", "0", *flags]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not found:
            self.proc.kill()
            raise RuntimeError(f"pbkv serve did not start: {line!r} {self.stderr()[-2000:]}")
        self.port = int(found.group(1))
        self.url = f"http://{HOST}:{self.port}"
        self.exited_early = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def signal(self, signum: int) -> None:
        if not self.alive():
            self.exited_early = True
        else:
            self.proc.send_signal(signum)

    def wait(self, limit_s: float) -> tuple[int | None, float]:
        """Wait for the server to exit; return its status (``None``: killed at
        ``limit_s``) and how long it took."""
        started = time.monotonic()
        try:
            self.proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None, time.monotonic() - started
        return self.proc.returncode, time.monotonic() - started

    def stop(self, tally: Tally, limit_s: float = 30.0) -> float:
        """SIGTERM the server and count how it ended; return the seconds it took."""
        self.signal(signal.SIGTERM)
        status, took_s = self.wait(limit_s)
        count_exit(tally, self, status)
        return took_s

    def contained_failures(self) -> int:
        return self.stderr().count("failed; it is closed, the server goes on")


def count_exit(tally: Tally, served: Served, status: int | None) -> None:
    """Count how ``served`` ended (``status``; ``None``: killed at its limit) in ``tally``."""
    if served.exited_early or (status is not None and status != 0):
        tally.crashes += 1
        tally.unexpected.append(f"server exited with {status}: {served.stderr()[-1500:]}")
    if status is None:
        tally.hangs += 1
        tally.unexpected.append("server did not exit within its limit after a signal")


class Client(httpx.Client):
    """An httpx client of one protocol: HTTP/2 by prior knowledge, or HTTP/1.1."""

    def __init__(self, url: str, http2: bool) -> None:
        super().__init__(base_url=url, http1=not http2, http2=http2, timeout=CLIENT_TIMEOUT_S)
        self.protocol = "HTTP/2" if http2 else "HTTP/1.1"


def connect(url: str, http2: bool) -> Client:
    """Return a client of ``url`` over HTTP/2 (prior knowledge) or HTTP/1.1."""
    return Client(url, http2)


def auth(key: str) -> dict[str, str]:
    """Return the headers that send API key ``key``."""
    return {"Authorization": f"Bearer {key}"}


def _error_code(payload: Any) -> str | None:
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        error = payload["error"]
        if error.get("message"):
            return str(error.get("code") or error.get("type") or "error")
    return None


def judge_whole(response: httpx.Response) -> Outcome:
    """Return what a whole (not streamed) response counts as."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if response.is_success and isinstance(payload, dict) and "choices" in payload:
        workflow_id = response.headers.get("x-pbkv-workflow-id", "")
        return Outcome("completed", response.status_code, "", workflow_id)
    if response.is_success and response.request.url.path in ("/health", "/stats"):
        return Outcome("completed", response.status_code)
    code = _error_code(payload)
    if code is not None and response.status_code >= 400:
        return Outcome("refused", response.status_code, code)
    return Outcome("lost", response.status_code, response.text[:200])


def _judge_stream(status: int, events: list[str], body: str) -> Outcome:
    if status != 200:
        try:
            code = _error_code(json.loads(body))
        except ValueError:
            code = None
        if code is not None:
            return Outcome("refused", status, code)
        return Outcome("lost", status, body[:200])
    if not events or events[-1] != "data: [DONE]":
        return Outcome("lost", status, f"stream cut after {len(events)} events")
    errors = [_error_code(json.loads(e[6:])) for e in events[:-1] if '"error"' in e]
    if errors and errors[-1]:
        return Outcome("refused", status, errors[-1])
    return Outcome("completed", status)


def request(
    client: Client,
    method: str,
    path: str,
    *,
    stream: bool = False,
    **kwargs: Any,
) -> Outcome:
    """Send one request; return what it got (never raises)."""
    return _sent(client, method, path, stream, kwargs)._replace(protocol=client.protocol)


def _sent(client: Client, method: str, path: str, stream: bool, kwargs: dict[str, Any]) -> Outcome:
    try:
        if not stream:
            return judge_whole(client.request(method, path, **kwargs))
        with client.stream(method, path, **kwargs) as response:
            if response.status_code != 200:
                return _judge_stream(response.status_code, [], response.read().decode())
            events = [line for line in response.iter_lines() if line]
            judged = _judge_stream(200, events, "")
            return judged._replace(workflow_id=response.headers.get("x-pbkv-workflow-id", ""))
    except httpx.TimeoutException as exc:
        return Outcome("hang", 0, repr(exc))
    except (httpx.HTTPError, OSError) as exc:
        return Outcome("lost", 0, repr(exc))


def chat_body(text: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    """Return a chat completion body of one user message to :data:`MODEL`."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    return body | {"max_tokens": max_tokens} | extra


def in_threads(jobs: Sequence[Callable[[], Any]], concurrency: int) -> list[Any]:
    """Run ``jobs`` on ``concurrency`` threads; return their results in order."""
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda job: job(), jobs))
