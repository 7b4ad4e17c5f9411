"""The pbkv command line: `pbkv bench` compares cache policies on one workload, `pbkv serve`
serves an OpenAI-compatible API."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from rich.console import Console

from pbkv.cli.bench import add_bench, add_sweep, add_trace_plot
from pbkv.cli.calibrate import add_calibrate
from pbkv.cli.decode import add_bench_decode
from pbkv.cli.demo import add_demo
from pbkv.cli.predictor import add_predictor_commands

# torch's OpenMP threads spin while waiting; on a loaded 2-core machine that cuts CPU
# prefill from ~150 to ~20 tokens/s. Must be set before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["build_parser", "main"]


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from pbkv.server.cli import add_arguments, run

    p = sub.add_parser(
        "serve",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="serve an OpenAI-compatible API with workflow hints (needs the serve extra)",
        description="Serve /v1/chat/completions, /v1/completions, /v1/models, /health, /stats "
        "and /metrics over a live runtime; X-PBKV-Workflow-Id / X-PBKV-Agent / X-PBKV-Final "
        "headers or a pbkv body object say which workflow and agent call.",
    )
    add_arguments(p)
    p.set_defaults(run=run)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of every ``pbkv`` command; each sets ``run(args, console)``."""
    parser = argparse.ArgumentParser(prog="pbkv", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench(sub)
    add_sweep(sub)
    add_trace_plot(sub)
    add_demo(sub)
    add_calibrate(sub)
    add_bench_decode(sub)
    add_predictor_commands(sub)
    _add_serve(sub)
    from pbkv.cluster import add_cluster_parser

    add_cluster_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``pbkv`` command line; return the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    if os.getcwd() not in sys.path:  # --app my_module:app finds my_module.py here (last,
        sys.path.append(os.getcwd())  # so it never shadows an installed package)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    # Piped output would be cut to 80 columns; the comparison table fits 100.
    console = Console() if sys.stdout.isatty() else Console(width=100)
    from pbkv.live.driver import NodeFailed  # an app's own code raised (named by node)

    try:
        return args.run(args, console)
    except (ValueError, OSError, NodeFailed) as exc:
        Console(stderr=True, width=console.width).print(
            f"[red]pbkv: error:[/red] {exc}", soft_wrap=True
        )
        return 2
