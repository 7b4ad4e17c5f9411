"""``pbkv demo``: the live-codegen app served on a real model under each policy."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from pbkv.cli.arguments import policy_specs, positive_int
from pbkv.cli.output import check_writable, exit_status, progress_bar


def add_demo(sub: argparse._SubParsersAction) -> None:
    from pbkv.demo import DemoConfig

    d = DemoConfig()
    p = sub.add_parser(
        "demo",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="a live app (Planner -> Coder -> tests run for real) on SmolLM2: lru, "
        "lru:workflow and pbkv",
        description="Serve the live-codegen app on a real model: routing follows what the "
        "model writes, the tester runs the generated code's tests in a subprocess. Every "
        "policy serves the same tasks; prints the wall-clock comparison and the path each "
        "workflow took; with --repeats, each policy's gain over the first and, for pbkv, over "
        "the strongest baseline, with its spread. About 10 minutes on a 2-core CPU at the "
        "defaults; on CUDA when a GPU is visible.",
    )
    p.add_argument("--model", default=d.model, help="smollm2, tiny or a checkpoint folder")
    p.add_argument(
        "--policies",
        type=policy_specs,
        default=",".join(d.policies),
        help="comma-separated policies, in the order compared (the first is the baseline); "
        "a policy may name its scheduler as policy:scheduler (e.g. pbkv:fcfs, lru:workflow), "
        "else it runs its default (pbkv: workflow, the others fcfs)",
    )
    p.add_argument("--workflows", type=positive_int, default=d.workflows, help="tasks served")
    p.add_argument(
        "--concurrency", type=positive_int, default=d.concurrency, help="workflows in flight"
    )
    p.add_argument(
        "--gpu-kv-tokens",
        type=positive_int,
        default=None,
        help="GPU KV tier in tokens (default: half the concurrent working set of a dry run)",
    )
    p.add_argument(
        "--host-ratio", type=float, default=d.host_ratio, help="host tier size / GPU tier size"
    )
    p.add_argument(
        "--max-retries", type=int, default=d.max_retries, help="Analyzer -> Coder retries"
    )
    p.add_argument(
        "--code-tokens", type=positive_int, default=d.code_tokens, help="Coder decode budget"
    )
    p.add_argument(
        "--context-tokens",
        type=int,
        default=d.context_tokens,
        help="about this many tokens of reference per task (a module's docs; 0: none)",
    )
    p.add_argument(
        "--shared-context",
        action=argparse.BooleanOptionalAction,
        default=d.shared_context,
        help="the agents read one conversation, each its role last, so they share the "
        "workflow's cached context (--no-shared-context: each agent's role opens its prompt)",
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="runs of every policy, rotated (the gain is printed with its spread)",
    )
    p.add_argument("--device", default=None, help="torch device (None: CUDA if visible)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the dry runs")
    p.add_argument("--json", dest="json_path", default=None, help="also write results here")
    p.add_argument(
        "--traces", default=None, help="append the live runs' traces here (JSONL, pbkv train)"
    )
    p.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace, console: Console) -> int:
    from pbkv.actors.traces import TraceRecorder
    from pbkv.bench.records import command_line
    from pbkv.bench.report import comparison_table
    from pbkv.demo import (
        DemoConfig,
        demo_record,
        first_runs,
        gain_verdict,
        paths_table,
        repeats_table,
        run_demo,
    )

    check_writable(args.json_path)
    check_writable(args.traces)
    config = DemoConfig(
        model=args.model,
        policies=args.policies,
        workflows=args.workflows,
        concurrency=args.concurrency,
        gpu_kv_tokens=args.gpu_kv_tokens,
        host_ratio=args.host_ratio,
        max_retries=args.max_retries,
        code_tokens=args.code_tokens,
        device=args.device,
        seed=args.seed,
        context_tokens=args.context_tokens,
        repeats=args.repeats,
        shared_context=args.shared_context,
    )
    recorder = TraceRecorder(args.traces, keep=False) if args.traces else None
    try:
        with progress_bar(console) as progress:
            bars = {
                p: progress.add_task(f"live-codegen {p}", total=args.workflows * args.repeats)
                for p in args.policies
            }
            demo = run_demo(
                config, on_outcome=lambda p, _: progress.advance(bars[p]), trace_sink=recorder
            )
    finally:
        if recorder is not None:
            recorder.close()
    title = (
        f"live-codegen: {len(demo.tasks)} workflows, concurrency {args.concurrency}, "
        f"GPU KV {demo.gpu_kv_tokens:,} / host {demo.host_kv_tokens:,} tokens, "
        f"{demo.model} on {demo.device} (wall-clock seconds"
        + (f"; the first of {args.repeats} repeats, all below)" if args.repeats > 1 else ")")
    )
    console.print(comparison_table([run.result for run in first_runs(demo)], title))
    console.print(paths_table(demo))
    console.print(repeats_table(demo))
    console.print(gain_verdict(demo))
    results = [run.result for run in demo.runs]
    if recorder is not None:
        console.print(f"appended {recorder.written} traces to {args.traces}")
    if args.json_path:
        Path(args.json_path).write_bytes(demo_record(demo, command_line(args.argv)))
        console.print(f"wrote {args.json_path}")
    return exit_status(results, console)
