"""What ``pbkv serve`` adds over the in-process runtime: latency and throughput.

``python -m pbkv.bench.serve`` starts ``pbkv serve`` (tiny torch model by default) as a
subprocess on 127.0.0.1 (a free port) and measures, against a runtime of the same
configuration opened in this process:

- the latency of a 1-token chat completion, one request at a time: the real openai client
  over HTTP vs ``rt.workflow()`` + ``wf.call`` in process (each request is a one-request
  workflow on both sides), as p50/p99 and the difference (what HTTP adds);
- requests/s with ``--clients`` concurrent clients (threads with their own openai
  client) vs as many concurrent in-process tasks.

Wall-clock seconds (``time.perf_counter``). Not a test: speed is reported side by side,
never asserted. All traffic goes to 127.0.0.1 and is bounded by the request counts.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as pbkv.cli: before torch loads

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant of a multi-agent team."},
    {"role": "user", "content": "Reply with one word."},
]
_URL = re.compile(r"http://127\.0\.0\.1:(\d+)")


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Latency percentiles of one path, in milliseconds."""

    p50_ms: float
    p99_ms: float
    mean_ms: float
    requests: int

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencySummary:
        ms = np.asarray(seconds) * 1e3
        return cls(
            float(np.percentile(ms, 50)),
            float(np.percentile(ms, 99)),
            float(ms.mean()),
            len(ms),
        )


@dataclass(frozen=True, slots=True)
class ServeBenchResult:
    """Both paths' 1-token latency and concurrent throughput."""

    model: str
    in_process: LatencySummary
    http: LatencySummary
    clients: int
    throughput_requests: int
    throughput_tokens: int
    in_process_requests_per_s: float
    http_requests_per_s: float


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    """Start ``pbkv serve --port 0``; return the process and its OpenAI base URL."""
    command = [
        sys.executable,
        "-m",
        "pbkv.cli",
        "serve",
        "--engine",
        "torch",
        "--model",
        args.model,
        "--policy",
        args.policy,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--max-batch-size",
        str(args.clients),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        match = _URL.search(line)
        if match:
            return proc, f"http://127.0.0.1:{match.group(1)}/v1"
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"pbkv serve did not report its address (exit {proc.wait()})")


def _stop_server(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _http_client(base_url: str):  # -> openai.OpenAI
    import openai

    return openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=120)


def _http_call(client, model: str, max_tokens: int) -> float:
    start = time.perf_counter()
    reply = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=max_tokens, temperature=0
    )
    elapsed = time.perf_counter() - start
    if reply.usage.completion_tokens != max_tokens:
        raise RuntimeError(f"asked for {max_tokens} tokens, got {reply.usage.completion_tokens}")
    return elapsed


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_http(base_url: str, model: str, args: argparse.Namespace) -> tuple[list[float], float]:
    """Return the sequential 1-token latencies and the concurrent requests/s over HTTP."""
    client = _http_client(base_url)
    for _ in range(args.warmup):
        _http_call(client, model, 1)
    latencies = [_http_call(client, model, 1) for _ in range(args.requests)]
    clients = [_http_client(base_url) for _ in range(args.clients)]

    def one_client(c) -> None:
        for _ in range(args.per_client):
            _http_call(c, model, args.throughput_tokens)

    with ThreadPoolExecutor(args.clients) as pool:
        elapsed = _timed(lambda: list(pool.map(one_client, clients)))
    return latencies, args.clients * args.per_client / elapsed


def bench_in_process(args: argparse.Namespace) -> tuple[str, list[float], float]:
    """Return the model name, sequential 1-token latencies and concurrent requests/s."""
    import trio

    import pbkv

    config = pbkv.RuntimeConfig(
        engine="torch", model=args.model, policy=args.policy, max_batch_size=args.clients
    )

    async def call(rt, max_tokens: int) -> float:
        start = time.perf_counter()
        async with rt.workflow() as wf:
            reply = await wf.call("assistant", MESSAGES, max_new_tokens=max_tokens)
        elapsed = time.perf_counter() - start
        if len(reply.token_ids) != max_tokens:
            raise RuntimeError(f"asked for {max_tokens} tokens, got {len(reply.token_ids)}")
        return elapsed

    async def main() -> tuple[str, list[float], float]:
        async with pbkv.open_runtime(config) as rt:
            for _ in range(args.warmup):
                await call(rt, 1)
            latencies = [await call(rt, 1) for _ in range(args.requests)]

            async def one_client() -> None:
                for _ in range(args.per_client):
                    await call(rt, args.throughput_tokens)

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(args.clients):
                    nursery.start_soon(one_client)
            elapsed = time.perf_counter() - start
            return rt.model_name, latencies, args.clients * args.per_client / elapsed

    return trio.run(main)


def run(args: argparse.Namespace) -> ServeBenchResult:
    """Measure the in-process runtime, then the same configuration served over HTTP."""
    model, local, local_rps = bench_in_process(args)
    proc, base_url = _start_server(args)
    try:
        remote, remote_rps = bench_http(base_url, model, args)
    finally:
        _stop_server(proc)
    return ServeBenchResult(
        model=model,
        in_process=LatencySummary.of(local),
        http=LatencySummary.of(remote),
        clients=args.clients,
        throughput_requests=args.clients * args.per_client,
        throughput_tokens=args.throughput_tokens,
        in_process_requests_per_s=local_rps,
        http_requests_per_s=remote_rps,
    )


def report(result: ServeBenchResult) -> str:
    """Return the result as a plain-text table."""
    a, b = result.in_process, result.http
    rows = [
        f"1-token chat completion latency, {a.requests} sequential requests ({result.model})",
        f"{'':>22} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9}",
        f"{'in-process':>22} {a.p50_ms:9.2f} {a.p99_ms:9.2f} {a.mean_ms:9.2f}",
        f"{'HTTP (openai client)':>22} {b.p50_ms:9.2f} {b.p99_ms:9.2f} {b.mean_ms:9.2f}",
        f"{'added by HTTP':>22} {b.p50_ms - a.p50_ms:9.2f} {b.p99_ms - a.p99_ms:9.2f} "
        f"{b.mean_ms - a.mean_ms:9.2f}",
        "",
        f"throughput: {result.clients} concurrent clients, {result.throughput_requests} "
        f"requests of {result.throughput_tokens} tokens",
        f"{'in-process':>22} {result.in_process_requests_per_s:9.1f} requests/s",
        f"{'HTTP (openai client)':>22} {result.http_requests_per_s:9.1f} requests/s "
        f"({result.http_requests_per_s / result.in_process_requests_per_s:.2f}x in-process)",
    ]
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pbkv.bench.serve",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default="tiny", help="tiny, smollm2 or a checkpoint folder")
    p.add_argument("--policy", default="pbkv", help="cache policy")
    p.add_argument("--requests", type=int, default=200, help="sequential latency requests")
    p.add_argument("--warmup", type=int, default=10, help="untimed requests first")
    p.add_argument("--clients", type=int, default=32, help="concurrent clients")
    p.add_argument("--per-client", type=int, default=8, help="requests per concurrent client")
    p.add_argument(
        "--throughput-tokens", type=int, default=1, help="completion tokens per throughput request"
    )
    p.add_argument("--json", dest="json_path", default=None, help="also write the result here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("requests", "clients", "per_client", "throughput_tokens"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    result = run(args)
    print(report(result))
    if args.json_path:
        import msgspec

        with open(args.json_path, "wb") as f:
            f.write(msgspec.json.encode(asdict(result)))
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
