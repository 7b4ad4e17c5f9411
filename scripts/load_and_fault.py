"""Load ``pbkv serve`` and inject faults on 127.0.0.1; report what every request got.

Starts ``pbkv serve --engine sim`` as a subprocess on 127.0.0.1 (a free port) for each
phase and drives it with real HTTP/1.1 and HTTP/2 (cleartext, prior knowledge) clients:

- ``load``: chat, streamed chat and text completions from two tenants (API keys), as
  one-request and hinted multi-turn workflows, mixed with the triggers of issue 27: 1 MB
  bodies answered before they are read (405, 401, 413) over HTTP/2, ``/stats`` spelled
  ``/stats/``, ``/stats//``, ``/%73tats/`` without a key, temperature 1e-46 and top_p
  1e-46, JSON nested 100,000 deep, a 1 M-character prompt (with ``/health`` timed while
  it is tokenized), a client stalled mid-body, ``"final": false`` in the body against
  ``X-PBKV-Final: true``; then the cross-tenant checks (each key's ``/stats``, cached
  tokens across tenants, one-request ids) and the CLI's option checks.
- ``sigterm``: workflows left open (never final, four tenants), then SIGTERM: the server
  must exit within its graceful timeout.
- ``double_sigint``: streams and whole requests in flight over both protocols, then
  SIGINT twice: every accepted request must be answered or errored (an error event and
  ``[DONE]`` for a stream).
- ``fault``: a fault injected into one call (``--fault-injection``, its stop callback
  raises) while 20 others run: the 20 must complete, the faulted one get a 500.

Every request is counted once: ``completed`` (2xx, a stream ending in ``[DONE]``),
``refused`` (an OpenAI error body, or a stream's error event then ``[DONE]``), ``lost``
(no answer, a cut stream, a 5xx without an error body), ``hangs`` (no answer within the
client timeout). ``crashes`` counts servers that exited before being asked to, or with
a non-zero status; a server not gone within its limit after a signal is a hang.
``cross_tenant_leaks`` counts checks that saw another tenant's data. A trigger answered
with another status than expected is listed under ``unexpected``. The server, the clients
and the judging of each request are ``scripts/serve_harness.py``, beside this script.

Bounded: every client has a timeout, every phase a fixed number of requests, every
server a deadline to exit (then it is killed). ``--short`` (the default, seconds; run by
``tests/server/test_load_and_fault.py``) and ``--long`` (minutes, by hand). Exit status
1 when anything was lost, crashed, hung, leaked or unexpected.

Usage: ``python scripts/load_and_fault.py [--long] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:  # serve_harness.py, beside this
    sys.path.append(str(Path(__file__).resolve().parent))

from serve_harness import (  # noqa: E402
    CLIENT_TIMEOUT_S,
    COUNTERS,
    HOST,
    KINDS,
    MODEL,
    Outcome,
    Served,
    Tally,
    auth,
    chat_body,
    connect,
    count_exit,
    in_threads,
    judge_whole,
    request,
)

KEYS = {"key-acme": "acme", "key-globex": "globex"}
ADMIN = "key-admin"
ONE_MB = b"a" * 1_000_000


@dataclass(frozen=True)
class Sizes:
    """How much each phase sends."""

    requests_per_protocol: int  # ordinary requests of the load phase, per protocol
    concurrency: int
    trigger_rounds: int  # how many times the load phase repeats its triggers
    open_workflows: int  # left open at SIGTERM
    sigint_streams: int  # in flight at the double SIGINT, per protocol
    fault_rounds: int  # faults injected, each while 20 other calls run


SHORT = Sizes(16, 8, 1, 40, 4, 1)
LONG = Sizes(1500, 32, 10, 2000, 40, 6)


# Phase: load, triggers and tenants


def _ordinary(url: str, http2: bool, index: int, tally: Tally) -> Outcome:
    """One ordinary request: by index, a chat, streamed chat, completion or workflow turn;
    the workflow id the server names is kept under the caller's tenant."""
    key = list(KEYS)[index % 2]
    tenant = KEYS[key]
    path, stream = "/v1/chat/completions", False
    if index % 4 == 0:
        body = chat_body(f"question {index}")
    elif index % 4 == 1:
        body = chat_body(f"question {index}", 6, stream=True)
        body["stream_options"] = {"include_usage": True}
        stream = True
    elif index % 4 == 2:
        path, body = "/v1/completions", {"model": MODEL, "prompt": f"complete {index}"}
        body["max_tokens"] = 3
    else:
        workflow = f"{tenant}-{'h2' if http2 else 'h1'}-job-{index // 8}"
        body = chat_body(f"turn {index}", 3, pbkv={"workflow_id": workflow, "agent": "a"})
        body["pbkv"]["final"] = index % 8 == 7
    with connect(url, http2) as client:
        outcome = request(client, "POST", path, stream=stream, json=body, headers=auth(key))
    if outcome.workflow_id:
        tally.keep_workflow_id(tenant, outcome.workflow_id)
    return tally.count(outcome)


def _h2_triggers(url: str, tally: Tally) -> None:
    """1 MB bodies answered before they are read, over one HTTP/2 connection."""
    key = auth("key-acme")
    with connect(url, http2=True) as client:
        for _ in range(2):  # twice: the connection must stay usable
            tally.expect(
                "h2 1 MB POST /health", request(client, "POST", "/health", content=ONE_MB), 405
            )
            tally.expect(
                "h2 1 MB POST without a key",
                request(client, "POST", "/v1/chat/completions", content=ONE_MB),
                401,
            )
            big = b"a" * (5 * 2**20)  # past the 4 MiB limit
            tally.expect(
                "h2 5 MB POST",
                request(client, "POST", "/v1/chat/completions", content=big, headers=key),
                413,
            )
        tally.expect("h2 GET /health after", request(client, "GET", "/health"), 200)


def _auth_triggers(url: str, tally: Tally) -> None:
    with connect(url, http2=False) as client:
        for path in ("/stats", "/stats/", "/stats//", "/%73tats/", "/nothing"):
            outcome = tally.expect(f"GET {path} without a key", request(client, "GET", path), 401)
            if outcome.status == 200:
                tally.leak(f"GET {path} answered without a key")


def _sampling_and_json_triggers(url: str, tally: Tally) -> None:
    key = auth("key-globex")
    with connect(url, http2=False) as client:
        for name, extra in (
            ("temperature 1e-46", {"temperature": 1e-46}),
            ("top_p 1e-46", {"temperature": 0.7, "top_p": 1e-46}),
        ):
            body = chat_body("sample", 3, **extra)
            tally.expect(
                name, request(client, "POST", "/v1/chat/completions", json=body, headers=key), 200
            )
        nested = (
            b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "x"}],'
        )
        nested += b' "tools": [{"f": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
        tally.expect(
            "JSON nested 100,000 deep",
            request(client, "POST", "/v1/chat/completions", content=nested, headers=key),
            400,
        )


def _large_prompt_trigger(url: str, tally: Tally) -> None:
    """A 1 M-character prompt (about a second to tokenize); /health is timed meanwhile.

    Tokenized on the event loop, it would hold every other request for as long as it
    takes: a /health wait of more than half that (and over a second) says so.
    """
    done = threading.Event()
    gaps_s: list[float] = []
    took_s = 0.0

    def large() -> None:
        nonlocal took_s
        started = time.monotonic()
        with connect(url, http2=False) as client:
            body = {"model": MODEL, "prompt": "hello world, " * 77_000, "max_tokens": 2}
            tally.expect(
                "1 M-character prompt",
                request(client, "POST", "/v1/completions", json=body, headers=auth("key-acme")),
                400,
            )
        took_s = time.monotonic() - started
        done.set()

    thread = threading.Thread(target=large)
    thread.start()
    with connect(url, http2=False) as client:
        while not done.is_set():
            started = time.monotonic()
            outcome = request(client, "GET", "/health")
            tally.expect("GET /health during the large prompt", outcome, 200)
            gaps_s.append(time.monotonic() - started)
            time.sleep(0.05)
    thread.join()
    worst = max(gaps_s, default=0.0)
    tally.notes["large_prompt_answered_after_s"] = round(took_s, 3)
    tally.notes["health_worst_s_during_large_prompt"] = round(worst, 3)
    if worst > max(1.0, took_s / 2):
        tally.unexpected.append(
            f"/health waited {worst:.2f} s while a prompt took {took_s:.2f} s to refuse"
        )


def _stalled_body_trigger(url: str, port: int, tally: Tally) -> None:
    """Headers and one byte of a 100-byte body, then nothing: a 408 must come."""
    started = time.monotonic()
    try:
        with socket.create_connection((HOST, port), timeout=CLIENT_TIMEOUT_S) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer key-acme\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            answer = sock.recv(65536)
        found = re.match(rb"HTTP/1\.1 (\d+)", answer)
        outcome = Outcome("refused", int(found.group(1))) if found else Outcome("lost", 0)
    except TimeoutError:
        outcome = Outcome("hang", 0, "no answer to a stalled body")
    tally.expect("a client stalled mid-body", outcome, 408)
    tally.notes["stalled_body_answered_after_s"] = round(time.monotonic() - started, 2)


def _final_trigger(url: str, tally: Tally) -> None:
    """X-PBKV-Final: true with ``"final": false`` in the body: the workflow stays open."""
    with connect(url, http2=False) as client:
        body = chat_body("hi", 2, pbkv={"workflow_id": "final-check", "final": False})
        headers = auth("key-globex") | {"X-PBKV-Final": "true"}
        tally.expect(
            "final: false in the body, true in the header",
            request(client, "POST", "/v1/chat/completions", json=body, headers=headers),
            200,
        )
        stats = client.get("/stats", headers=auth("key-globex")).json()
    states = [w["state"] for w in stats["workflows"] if w["workflow_id"] == "final-check"]
    if states != ["active"]:
        tally.unexpected.append(f"final: false in the body did not win: {states}")


def _tenant_checks(url: str, tally: Tally) -> None:
    """Each key's /stats names only its tenant; a prompt one tenant sent is not cached
    for another; one-request ids are random."""
    with connect(url, http2=False) as client:
        prompt = chat_body("a prompt both tenants send, long enough to fill blocks " * 8, 2)
        # its own system message: the template's default one, which every bare user
        # message starts with, is in each tenant's cache from its earlier requests
        prompt["messages"].insert(0, {"role": "system", "content": "Tenant check."})
        first = client.post("/v1/chat/completions", json=prompt, headers=auth("key-acme"))
        other = client.post("/v1/chat/completions", json=prompt, headers=auth("key-globex"))
        again = client.post("/v1/chat/completions", json=prompt, headers=auth("key-acme"))
        for response in (first, other, again):
            tally.count(judge_whole(response))
        cached = [
            r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (other, again)
        ]
        if cached[0] != 0:
            tally.leak(f"globex's first request read {cached[0]} tokens acme cached")
        tally.notes["same_tenant_cached_tokens"] = cached[1]
        ids = [r.headers.get("x-pbkv-workflow-id", "") for r in (first, other, again)]
        if not all(re.fullmatch(r"req-[0-9a-f]{16}", i) for i in ids):
            tally.leak(f"one-request ids are not random: {ids}")
        for key, tenant in KEYS.items():
            response = client.get("/stats", headers=auth(key))
            strangers = [w for w in response.json()["workflows"] if w["tenant"] != tenant]
            if strangers:
                tally.leak(f"{tenant}'s /stats lists {len(strangers)} workflows of others")
            others = set().union(*(ids for t, ids in tally.ids_by_tenant.items() if t != tenant))
            named = sorted(i for i in others if i in response.text)
            if named:
                tally.leak(f"{tenant}'s /stats names others' workflows {named[:3]}")
            tally.notes[f"others_workflow_ids_checked_in_{tenant}_stats"] = len(others)
        admin = client.get("/stats", headers=auth(ADMIN)).json()
        tenants = {w["tenant"].split("/")[0] for w in admin["workflows"]}
        if not {"acme", "globex"} <= tenants:
            tally.unexpected.append(f"the admin key's /stats lists tenants {sorted(tenants)}")


OPTION_CHECKS = (
    ("--idle-timeout-s", "nan"),
    ("--idle-timeout-s", "1e-9"),
    ("--api-key", "k=a", "--api-key", "k=b"),
)
"""Options the CLI must refuse naming the option (status 2, no traceback)."""


def _option_check(flags: Sequence[str], tally: Tally) -> None:
    command = [sys.executable, "-m", "pbkv.cli", "serve", "--engine", "sim", "--port", "0"]
    run = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=60)
    if run.returncode != 2 or flags[0] not in run.stderr or "Traceback" in run.stderr:
        tally.unexpected.append(
            f"pbkv serve {' '.join(flags)}: {run.returncode} {run.stderr[-300:]}"
        )


def load_phase(sizes: Sizes) -> Tally:
    tally = Tally()
    keys = [f"--api-key={k}={t}" for k, t in KEYS.items()]
    served = Served(*keys, "--admin-key", ADMIN, "--body-timeout-s", "2", "--max-batch-size", "32")
    try:
        jobs: list[Callable[[], Any]] = []
        for http2 in (False, True):
            jobs += [
                (lambda i=i, h=http2: _ordinary(served.url, h, i, tally))
                for i in range(sizes.requests_per_protocol)
            ]
        for _ in range(sizes.trigger_rounds):
            jobs += [
                lambda: _h2_triggers(served.url, tally),
                lambda: _auth_triggers(served.url, tally),
                lambda: _sampling_and_json_triggers(served.url, tally),
                lambda: _stalled_body_trigger(served.url, served.port, tally),
            ]
        jobs += [lambda flags=flags: _option_check(flags, tally) for flags in OPTION_CHECKS]
        in_threads(jobs, sizes.concurrency)
        _large_prompt_trigger(served.url, tally)
        _final_trigger(served.url, tally)
        _tenant_checks(served.url, tally)
        tally.notes["contained_connection_failures"] = served.contained_failures()
        if not served.alive():
            served.exited_early = True
    finally:
        served.stop(tally)
    return tally


# Phase: workflows open at SIGTERM


def sigterm_phase(sizes: Sizes, graceful_timeout_s: float = 5.0) -> Tally:
    tally = Tally()
    tenants = [f"t{i}" for i in range(4)]
    served = Served(
        "--graceful-timeout-s", str(graceful_timeout_s), "--max-batch-size", "64",
        "--max-workflows", str(max(4096, sizes.open_workflows)),
    )  # fmt: skip

    def open_one(i: int) -> Outcome:
        body = chat_body(f"open {i}", 1, pbkv={"workflow_id": f"w{i}"}, cache_salt=tenants[i % 4])
        with connect(served.url, http2=bool(i % 2)) as client:
            return tally.count(request(client, "POST", "/v1/chat/completions", json=body))

    try:
        in_threads([lambda i=i: open_one(i) for i in range(sizes.open_workflows)], 32)
        with connect(served.url, http2=False) as client:
            stats = client.get("/stats").json()  # no keys: only the default tenant is listed
        tally.notes["open_workflows_at_sigterm"] = stats["sessions"]["active"]
    finally:
        took_s = served.stop(tally, limit_s=graceful_timeout_s + 60)
    tally.notes["exit_after_sigterm_s"] = round(took_s, 2)
    tally.notes["graceful_timeout_s"] = graceful_timeout_s
    if took_s > graceful_timeout_s:
        tally.hangs += 1
        tally.unexpected.append(
            f"exit took {took_s:.1f} s with {sizes.open_workflows} workflows open, more than "
            f"the graceful timeout of {graceful_timeout_s} s"
        )
    return tally


# Phase: double SIGINT


def double_sigint_phase(sizes: Sizes) -> Tally:
    tally = Tally()
    served = Served("--graceful-timeout-s", "60", "--max-batch-size", "64")
    outcomes: list[Outcome] = []

    def in_flight(i: int, http2: bool) -> None:
        stream = i % 3 != 2  # two streams to one whole request
        body = chat_body(f"long {i}", 4000, stream=stream)
        with connect(served.url, http2) as client:
            outcome = request(client, "POST", "/v1/chat/completions", stream=stream, json=body)
        outcomes.append(tally.count(outcome))

    threads = [
        threading.Thread(target=in_flight, args=(i, http2))
        for http2 in (False, True)
        for i in range(sizes.sigint_streams)
    ]
    status: int | None = None
    took_s = 0.0
    try:
        for thread in threads:
            thread.start()
        _until_in_flight(served.url, len(threads))
        served.signal(signal.SIGINT)
        time.sleep(0.5)  # trio merges a signal repeated before it is read
        served.signal(signal.SIGINT)
        for thread in threads:
            thread.join(CLIENT_TIMEOUT_S + 5)
        status, took_s = served.wait(30)
    finally:
        if served.alive():
            served.proc.kill()
    count_exit(tally, served, status)
    tally.notes["exit_after_second_sigint_s"] = round(took_s, 2)
    tally.notes["answered_shutting_down"] = sum(1 for o in outcomes if o.detail == "shutting_down")
    return tally


def _until_in_flight(url: str, calls: int, limit_s: float = CLIENT_TIMEOUT_S) -> None:
    """Wait until ``calls`` calls are in flight in the runtime (or ``limit_s`` passes)."""
    deadline = time.monotonic() + limit_s
    with connect(url, http2=False) as client:
        while time.monotonic() < deadline:
            stats = client.get("/stats").json()
            if stats["runtime"]["calls_in_flight"] >= calls:
                return
            time.sleep(0.1)


# Phase: one call's fault while 20 others run


def fault_phase(sizes: Sizes) -> Tally:
    tally = Tally()
    served = Served("--fault-injection", "--max-batch-size", "32")
    try:
        for round_ in range(sizes.fault_rounds):
            _fault_round(served, round_, tally)
        with connect(served.url, http2=False) as client:
            tally.expect("GET /health after the faults", request(client, "GET", "/health"), 200)
        if not served.alive():
            served.exited_early = True
    finally:
        served.stop(tally)
    return tally


def _fault_round(served: Served, round_: int, tally: Tally) -> None:
    """20 calls (streamed and whole, both protocols), then one with a fault injected."""
    outcomes: dict[str, Outcome] = {}

    def call(name: str, fault: bool, http2: bool, stream: bool) -> None:
        body = chat_body(f"{name} {round_}", 30, stream=stream)
        headers = {"X-PBKV-Inject-Fault": "until"} if fault else {}
        with connect(served.url, http2) as client:
            outcome = request(
                client, "POST", "/v1/chat/completions", stream=stream, json=body, headers=headers
            )
        outcomes[name] = tally.count(outcome)

    others = [
        threading.Thread(target=call, args=(f"other-{i}", False, i % 4 < 2, i % 2 == 1))
        for i in range(20)
    ]
    for thread in others:
        thread.start()
    _until_in_flight(served.url, 20)
    faulted = threading.Thread(target=call, args=("faulted", True, round_ % 2 == 1, False))
    faulted.start()
    for thread in [*others, faulted]:
        thread.join(CLIENT_TIMEOUT_S + 5)
    failed = [
        f"{n}: {o.status} {o.detail}"
        for n, o in outcomes.items()
        if n != "faulted" and o.kind != "completed"
    ]
    if failed or len(outcomes) != 21:
        tally.unexpected.append(
            f"fault round {round_}: {len(failed)} of the 20 others failed: {failed[:3]}"
        )
    got = outcomes.get("faulted")
    if got is None or (got.status, got.detail) != (500, "injected_fault"):
        tally.unexpected.append(f"fault round {round_}: the faulted call got {got}")


# Report


PHASES: dict[str, Callable[[Sizes], Tally]] = {
    "load": load_phase,
    "sigterm": sigterm_phase,
    "double_sigint": double_sigint_phase,
    "fault": fault_phase,
}


def run(sizes: Sizes, phases: Sequence[str] = tuple(PHASES)) -> dict[str, Any]:
    """Run ``phases``; return each one's figures and their totals."""
    report: dict[str, Any] = {"phases": {}}
    total = Tally()
    for name in phases:
        started = time.monotonic()
        tally = PHASES[name](sizes)
        figures = tally.figures() | {"wall_s": round(time.monotonic() - started, 1)}
        report["phases"][name] = figures
        for counter in COUNTERS:
            setattr(total, counter, getattr(total, counter) + getattr(tally, counter))
        for protocol, counts in tally.by_protocol.items():
            mine = total.by_protocol.setdefault(protocol, dict.fromkeys(KINDS, 0))
            for kind, n in counts.items():
                mine[kind] += n
        total.unexpected += [f"{name}: {u}" for u in tally.unexpected]
    report["total"] = {k: v for k, v in total.figures().items() if k != "notes"}
    return report


def failed(report: dict[str, Any]) -> bool:
    total = report["total"]
    bad = ("lost", "hangs", "crashes", "cross_tenant_leaks")
    return any(total[k] for k in bad) or bool(total["unexpected"])


def _print(report: dict[str, Any]) -> None:
    columns = COUNTERS
    heads = ("sent", "completed", "refused", "lost", "hangs", "crashes", "leaks")
    print(f"{'phase':<14}" + "".join(f"{c:>12}" for c in heads) + f"{'wall_s':>9}")
    for name, figures in report["phases"].items():
        print(
            f"{name:<14}"
            + "".join(f"{figures[c]:>12}" for c in columns)
            + f"{figures['wall_s']:>9}"
        )
    total = report["total"]
    print(f"{'total':<14}" + "".join(f"{total[c]:>12}" for c in columns))
    for protocol, counts in sorted(total["by_protocol"].items()):
        print(f"{'  ' + protocol:<14}" + "".join(f"{counts[c]:>12}" for c in KINDS))
    for name, figures in report["phases"].items():
        for note, value in figures["notes"].items():
            print(f"  {name}.{note} = {value}")
    for line in total["unexpected"]:
        print(f"  UNEXPECTED {line}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="the long run (minutes)")
    parser.add_argument("--phases", nargs="+", choices=tuple(PHASES), default=tuple(PHASES))
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    report = run(LONG if args.long else SHORT, args.phases)
    report["mode"] = "long" if args.long else "short"
    _print(report)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    return 1 if failed(report) else 0


if __name__ == "__main__":
    sys.exit(main())
