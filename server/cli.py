"""The options and entry of ``pbkv serve`` (the sub-command itself is in :mod:`pbkv.cli`).

Startup errors (an unknown model, an address that cannot be bound) leave the trio
nursery as an exception group; :func:`run` unwraps one whose errors are all
``ValueError`` / ``OSError`` into one error naming the option, which :func:`pbkv.cli.main`
prints on one line (exit status 2). SIGINT or SIGTERM drains the server (see
:meth:`pbkv.server.app.OpenAIApp.drain`); a second signal stops it at once.
"""

from __future__ import annotations

import argparse
import errno
import socket
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


def _tokens(minimum: int, rule: str) -> Any:
    """Return an argparse type: an int of at least ``minimum`` (``rule`` says why)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {rule}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
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
    p.add_argument(
        "--gpu-kv-tokens",
        type=_tokens(1, ">= 1 (at least one block is used)"),
        default=None,
        help="GPU KV capacity in tokens",
    )
    p.add_argument(
        "--host-kv-tokens",
        type=_tokens(0, ">= 0 (0: no host tier)"),
        default=None,
        help="host KV tier in tokens (0: none)",
    )
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
    p.add_argument(
        "--graceful-timeout-s",
        type=_seconds,
        default=5.0,
        help="at SIGINT/SIGTERM, how long requests in flight may finish (new ones get 503)",
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
    """Serve until SIGINT or SIGTERM, then drain; return the exit status.

    Raises:
        ValueError / OSError: the server could not start (one error naming the option).
    """
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
        graceful_timeout_s=args.graceful_timeout_s,
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
            await _until_stopped(server.app, config.graceful_timeout_s)
            nursery.cancel_scope.cancel()

    try:
        try:
            trio.run(main)
        except* KeyboardInterrupt:  # Ctrl-C while starting (trio >= 0.25: in a group)
            pass
    except (BaseExceptionGroup, ValueError, OSError) as error:  # trio < 0.25: not grouped
        raise _startup_error(error, args) from None
    console.print("pbkv serve: stopped")
    return 0


async def _until_stopped(app: Any, graceful_timeout_s: float) -> None:
    """Wait for SIGINT or SIGTERM, then drain ``app``; a second signal ends the drain."""
    import signal

    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            break
        async with trio.open_nursery() as nursery:

            async def second_signal() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()

            nursery.start_soon(second_signal)
            await app.drain(graceful_timeout_s)
            nursery.cancel_scope.cancel()


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        leaves.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves


def _startup_error(
    error: BaseExceptionGroup | ValueError | OSError, args: argparse.Namespace
) -> Exception:
    """Return the one error to report for a start that failed with ``error`` (a group on
    trio >= 0.25, the error itself before).

    Raises:
        BaseExceptionGroup: a group itself, unless all its errors are ``ValueError`` /
            ``OSError`` (those are the user's to fix; anything else is a bug to show).
    """
    if not isinstance(error, BaseExceptionGroup):
        leaves: list[BaseException] = [error]
    else:
        leaves = _leaves(error)
        if not leaves or not all(isinstance(e, ValueError | OSError) for e in leaves):
            raise error
    exc = leaves[0]
    where = f"{args.host}:{args.port}"
    if isinstance(exc, socket.gaierror):
        return OSError(f"--host {args.host}: not an address this machine can resolve ({exc})")
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return OSError(f"--port {args.port}: {where} is already in use")
    if isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL:
        return OSError(f"--host {args.host}: not an address of this machine ({exc.strerror})")
    if isinstance(exc, OSError):
        return OSError(f"cannot serve on {where}: {exc}")
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if args.model is not None and args.model in message:
        return ValueError(f"--model {args.model}: {message}")
    return ValueError(message)
