"""The options and entry of ``pbkv serve`` (the sub-command itself is in :mod:`pbkv.cli`)."""

from __future__ import annotations

import argparse
from typing import Any


def _api_key(text: str) -> tuple[str, str]:
    key, sep, tenant = text.partition("=")
    if not sep or not key or not tenant or "/" in tenant:
        raise argparse.ArgumentTypeError(f"expected KEY=TENANT (tenant without '/'), got {text!r}")
    return key, tenant


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``pbkv serve`` options to ``p``."""
    p.add_argument("--engine", choices=("sim", "torch"), default="torch", help="engine")
    p.add_argument(
        "--model",
        default=None,
        help="torch: tiny, smollm2 or a checkpoint folder (default tiny); sim: a model "
        "profile (default qwen3-32b)",
    )
    p.add_argument("--policy", default="pbkv", help="cache policy (lru, lae, he, pbkv, kvflow)")
    p.add_argument(
        "--predictor",
        default="none",
        help="forecaster for he/pbkv: none (retired-first, as lae), markov, markov-1..3, "
        "uniform or graphsage; all but none need --traces (their agents and fit)",
    )
    p.add_argument("--traces", default=None, help="traces (JSONL) the predictor is fitted on")
    p.add_argument("--checkpoint", default=None, help="GraphSAGE checkpoint folder")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=_port, default=8000, help="TCP port (0: any free port)")
    p.add_argument(
        "--idle-timeout-s",
        type=float,
        default=300.0,
        help="a workflow never marked final ends after this long idle",
    )
    p.add_argument(
        "--api-key",
        dest="api_keys",
        type=_api_key,
        action="append",
        default=None,
        metavar="KEY=TENANT",
        help="accept this API key as this tenant (repeatable); without any, every key is "
        "accepted and tenants come from cache_salt",
    )
    p.add_argument("--gpu-kv-tokens", type=int, default=None, help="GPU KV capacity in tokens")
    p.add_argument("--host-kv-tokens", type=int, default=None, help="host KV tier in tokens")
    p.add_argument("--max-batch-size", type=int, default=16, help="requests decoded together")
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=256,
        help="requests waiting for admission at most; past it requests get 429",
    )
    p.add_argument(
        "--default-max-tokens", type=int, default=256, help="decode budget when a request sets none"
    )


def forecasters(name: str, traces: str | None, checkpoint: str | None) -> tuple[Any, ...]:
    """Return the predictor's forecaster chain for ``--predictor`` (empty for ``none``).

    Raises:
        ValueError: a predictor without ``--traces``, or an unknown name (listing the known).
    """
    if name == "none":
        return ()
    if traces is None:
        raise ValueError(f"--predictor {name} needs --traces (its agents and its fit)")
    from pbkv.predictor import make_forecaster, read_traces

    records = read_traces(traces).records
    agents = sorted({a for r in records for a in r.agents})
    if not agents:
        raise ValueError(f"{traces}: no workflow steps to fit {name} on")
    chosen = make_forecaster(name, agents=agents, horizon=3, traces=records, checkpoint=checkpoint)
    if name.startswith("markov"):
        return (chosen,)
    return (chosen, make_forecaster("markov", agents=agents, horizon=3, traces=records))


def run(args: argparse.Namespace, console: Any) -> int:
    """Serve until interrupted (Ctrl-C); return the exit status."""
    import functools

    import trio

    from pbkv.live import RuntimeConfig
    from pbkv.server.app import ServerConfig
    from pbkv.server.serve import serve

    chain = forecasters(args.predictor, args.traces, args.checkpoint)
    runtime_config = RuntimeConfig(
        engine=args.engine,
        model=args.model,
        policy=args.policy,
        gpu_kv_tokens=args.gpu_kv_tokens,
        host_kv_tokens=args.host_kv_tokens,
        max_batch_size=args.max_batch_size,
        max_queued_requests=args.max_queued_requests,
    )
    config = ServerConfig(
        host=args.host,
        port=args.port,
        idle_timeout_s=args.idle_timeout_s,
        api_keys=dict(args.api_keys) if args.api_keys else None,
        default_max_tokens=args.default_max_tokens,
    )

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                functools.partial(serve, runtime_config, config, forecasters=chain)
            )
            console.print(
                f"pbkv serve: {server.app.model} ({args.engine}, policy {args.policy}) on "
                f"{server.address.url}  (OpenAI base_url {server.address.base_url})",
                soft_wrap=True,
            )

    try:
        trio.run(main)
    except* KeyboardInterrupt:  # trio >= 0.25 raises it inside an exception group
        console.print("pbkv serve: stopped")
    return 0
