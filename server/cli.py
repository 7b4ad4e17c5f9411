"""The options and entry of ``pbkv serve`` (the sub-command itself is in :mod:`pbkv.cli`).

Startup errors (an unknown model, an address that cannot be bound) leave the trio
nursery as an exception group; :func:`run` unwraps one whose errors are all
``ValueError`` / ``OSError`` into one error naming the option, which :func:`pbkv.cli.main`
prints on one line (exit status 2). SIGINT or SIGTERM drains the server and ends its open
workflows (:func:`pbkv.server.serve.shut_down`); a second signal cuts the requests still
running at once, each answered with an error (a stream: an error event and ``[DONE]``);
a third stops without waiting for their answers. A signal while starting stops the start.
Ctrl-C never prints a traceback: outside the server's own handling it ends the command
with status 130.
"""

from __future__ import annotations

import argparse
import errno
import math
import socket
from typing import Any

from pbkv.runtime.errors import exception_leaves


def _api_key(text: str) -> tuple[str, str]:
    key, sep, tenant = text.partition("=")
    if not sep or not key or not tenant or "/" in tenant:
        raise argparse.ArgumentTypeError(f"expected KEY=TENANT (tenant without '/'), got {text!r}")
    return key, tenant


class _APIKeys(argparse.Action):
    """Collect ``--api-key KEY=TENANT`` options; one key names one tenant (several keys
    may name the same tenant), so a key given again with another tenant is an error."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: Any, value: Any, option: Any = None
    ) -> None:
        keys = list(getattr(namespace, self.dest) or [])
        key, tenant = value
        earlier = dict(keys).get(key)
        if earlier is not None and earlier != tenant:
            raise argparse.ArgumentError(
                self, f"key {key!r} given twice, for tenants {earlier!r} and {tenant!r}"
            )
        setattr(namespace, self.dest, [*keys, value])


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


def _seconds(minimum: float) -> Any:
    """Return an argparse type: a finite number of seconds, at least ``minimum``."""

    def parse(text: str) -> float:
        value = float(text)
        if not (math.isfinite(value) and value >= minimum):  # NaN fails both
            raise argparse.ArgumentTypeError(
                f"must be a finite number of seconds >= {minimum:g}, got {text}"
            )
        return value

    return parse


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
        "--scheduler",
        default=None,
        help="admission scheduler: fcfs, lpm, fcfs-balanced, workflow, ... (default: the "
        "policy's own: workflow for pbkv, fcfs for the others)",
    )
    p.add_argument(
        "--predictor",
        default=None,
        help="forecaster for he/pbkv: online (default: learns each tenant's agent chain "
        "as workflows end, no training), none (retired-first, as lae), or fitted on "
        "--traces: markov, markov-1..3, uniform, graphsage",
    )
    p.add_argument("--traces", default=None, help="traces (JSONL) the predictor is fitted on")
    p.add_argument("--checkpoint", default=None, help="GraphSAGE checkpoint folder")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=_port, default=8000, help="TCP port (0: any free port)")
    p.add_argument(
        "--idle-timeout-s",
        type=_seconds(1.0),
        default=300.0,
        help="a workflow never marked final ends after this long idle (>= 1)",
    )
    p.add_argument(
        "--api-key",
        dest="api_keys",
        type=_api_key,
        action=_APIKeys,
        default=None,
        metavar="KEY=TENANT",
        help="accept this API key as this tenant (repeatable: several keys may name one "
        "tenant, a key names one tenant); without any, every key is accepted and tenants "
        "come from cache_salt",
    )
    p.add_argument(
        "--admin-key",
        default=None,
        metavar="KEY",
        help="this key's GET /stats lists every tenant's workflows (another key's lists "
        "its tenant's); it is accepted on /stats only",
    )
    p.add_argument(
        "--max-workflows",
        type=_tokens(1, ">= 1"),
        default=4096,
        help="open hinted workflows at most; past it the tenant holding the most ends its "
        "least recently used idle one (none idle: 429)",
    )
    p.add_argument(
        "--max-workflows-per-tenant",
        type=_tokens(1, ">= 1"),
        default=1024,
        help="open hinted workflows of one tenant at most; past it that tenant's least "
        "recently used idle one ends (none idle: 429)",
    )
    p.add_argument(
        "--body-timeout-s",
        type=_seconds(1.0),
        default=30.0,
        help="a request body of which no part arrives for this long is refused (408)",
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
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="requests decoded together (default: the engine's own, sim 64, torch 8)",
    )
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
        type=_seconds(0.0),
        default=5.0,
        help="at SIGINT/SIGTERM, how long requests in flight may finish (new ones get 503); "
        "a second signal cuts them at once, each answered with an error",
    )
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="the model name(s) clients send; the first is the one replies report "
        "(default: the engine's model name)",
    )
    p.add_argument(
        "--tool-call-parser",
        default="hermes",
        help="how tool calls are read out of replies: hermes (<tool_call>{json}</tool_call>, "
        "the format tools are rendered in; alias qwen25)",
    )
    p.add_argument(
        "--fault-injection",
        action="store_true",
        help="for fault tests only: a request with the header 'X-PBKV-Inject-Fault: until' "
        "gets a stop callback that raises at its first token",
    )


def forecasters(name: str | None, traces: str | None, checkpoint: str | None) -> tuple[Any, ...]:
    """Return the fitted forecaster chain ``--predictor`` names (empty for ``none``,
    ``online`` and the default: the runtime builds those itself).

    Raises:
        ValueError: a predictor without ``--traces``, or an unknown name (listing the known).
    """
    if name is None or name in ("none", "online"):
        return ()  # the runtime builds these itself (RuntimeConfig.predictor)
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
    """Serve until SIGINT or SIGTERM, then drain; return the exit status (130 when
    Ctrl-C came outside the server's own handling: while loading, or after it stopped).

    Raises:
        ValueError / OSError: the server could not start (one error naming the option).
    """
    interrupted = False
    try:
        try:
            _serve_until_stopped(args, console)
        except* KeyboardInterrupt:  # between trio's start and the signal receiver's
            interrupted = True
    except KeyboardInterrupt:  # while loading, before trio starts, or once it has ended
        interrupted = True
    except (BaseExceptionGroup, ValueError, OSError) as error:  # trio < 0.25: not grouped
        raise _startup_error(error, args) from None
    if interrupted:
        console.print("pbkv serve: interrupted")
        return 130
    console.print("pbkv serve: stopped")
    return 0


def _serve_until_stopped(args: argparse.Namespace, console: Any) -> None:
    """Start the server, serve until a signal, then shut it down (see the module)."""
    import functools
    import signal

    import trio

    from pbkv.live import RuntimeConfig
    from pbkv.server.config import ServerConfig
    from pbkv.server.serve import serve, shut_down

    chain = forecasters(args.predictor, args.traces, args.checkpoint)
    runtime_config = RuntimeConfig(
        engine=args.engine,
        model=args.model,
        policy=args.policy,
        scheduler=args.scheduler,
        predictor=args.predictor if args.predictor in (None, "none", "online") else "none",
        gpu_kv_tokens=args.gpu_kv_tokens,
        host_kv_tokens=args.host_kv_tokens,
        max_batch_size=args.max_batch_size,
        max_queued_requests=args.max_queued_requests,
    )
    config = ServerConfig(
        host=args.host,
        port=args.port,
        idle_timeout_s=args.idle_timeout_s,
        max_sessions=args.max_workflows,
        max_sessions_per_tenant=args.max_workflows_per_tenant,
        api_keys=dict(args.api_keys) if args.api_keys else None,
        admin_key=args.admin_key,
        default_max_tokens=args.default_max_tokens,
        graceful_timeout_s=args.graceful_timeout_s,
        body_timeout_s=args.body_timeout_s,
        fault_injection=args.fault_injection,
        served_model_name=args.served_model_name[0] if args.served_model_name else None,
        model_aliases=tuple(args.served_model_name[1:]) if args.served_model_name else (),
        tool_call_parser=args.tool_call_parser,
    )

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                stop = _Signals(nursery.cancel_scope)
                nursery.start_soon(stop.watch, signals)
                server = await nursery.start(
                    functools.partial(serve, runtime_config, config, forecasters=chain)
                )
                console.print(
                    f"pbkv serve: {server.app.model} ({args.engine}, policy {args.policy}, "
                    f"scheduler {runtime_config.resolved_scheduler}, predictor "
                    f"{args.predictor or runtime_config.resolved_predictor}) on "
                    f"{server.address.url}  (OpenAI base_url {server.address.base_url})",
                    soft_wrap=True,
                )
                stop.serving = True
                await stop.requested.wait()
                await shut_down(server, config.graceful_timeout_s, stop.hurry)
                nursery.cancel_scope.cancel()

    trio.run(main)


class _Signals:
    """What SIGINT / SIGTERM mean over the server's life: while starting, stop the
    start; then the first asks for a shutdown, the second hurries it (requests still
    running are cut, each answered with an error), a third cancels everything."""

    def __init__(self, cancel_scope: Any) -> None:
        import trio

        self._cancel_scope = cancel_scope
        self.serving = False
        self.requested = trio.Event()
        self.hurry = trio.Event()

    async def watch(self, signals: Any) -> None:
        async for _ in signals:
            if not self.serving or self.hurry.is_set():
                self._cancel_scope.cancel()
            elif self.requested.is_set():
                self.hurry.set()
            else:
                self.requested.set()


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
        leaves = exception_leaves(error)
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
