"""``pbkv bench``, ``pbkv sweep`` and ``pbkv trace-plot``: policies compared on one
generated workload, printed as a table (and written as JSON or a PNG plot)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from rich.console import Console

from pbkv.cli.arguments import float_list, positive_int
from pbkv.cli.output import check_writable, exit_status, progress_bar
from pbkv.cli.workload import add_workload_options, config_from


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="compare cache policies on one generated workload (virtual-time engine)",
        description="Serve the same workload under each policy through the actor system on the "
        "virtual-time engine and print one table (ratios vs lru).",
    )
    add_workload_options(p)
    p.add_argument(
        "--engine",
        choices=("sim", "trtllm-sim", "torch"),
        default="sim",
        help="sim: compare --policies on the owned-cache engine; trtllm-sim: TensorRT-LLM's "
        "default vs pbkv steering it (fake 1.2 block manager) vs pbkv owning the cache; "
        "torch: the real engine in wall-clock time (--model smollm2, tiny or a checkpoint; "
        "default rows lru, lru:workflow, pbkv; workloads cut to CPU size), with the "
        "calibrated sim's prediction beside it",
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="torch: runs of every row, in rotated order (spreads over them)",
    )
    p.add_argument("--json", dest="json_path", default=None, help="write results to this JSON file")
    p.add_argument(
        "--timeline",
        action="store_true",
        help="also write each row's per-invocation hit timeline into --json (large: a pair "
        "per invocation; pbkv trace-plot plots it)",
    )
    p.set_defaults(run=_run_bench)


def _title(config, gpu_tokens: int, engine: str = "sim", rate: float | None = None) -> str:
    host = config.host_kv_tokens if config.host_kv_tokens is not None else 2 * gpu_tokens
    model = "exclusive" if engine == "trtllm-sim" else config.host_tier
    loop = f"open loop at {rate:.4g} workflows/s, at most" if rate is not None else "concurrency"
    return (
        f"{config.app}: {config.workflows} workflows, {loop} {config.concurrency}, "
        f"GPU KV {gpu_tokens:,} tokens, host {host:,} ({model}), {config.hardware} x "
        f"{config.model} (simulated seconds)"
    )


def _compare(config, console: Console, engine: str = "sim"):  # -> BenchRun
    """Run every policy of ``config`` (and the bounds, on the sim) with a progress bar;
    print the table."""
    from pbkv.bench.compare import run_bench
    from pbkv.bench.report import comparison_table, gpu_tier_note, sim_cost_line
    from pbkv.bench.results import BenchRun

    labels = (*config.policies, "uncontested") if engine == "sim" else config.policies
    with progress_bar(console) as progress:
        tasks = {p: progress.add_task(f"{p:>6}", total=config.workflows) for p in labels}
        if engine == "trtllm-sim":
            from pbkv.bench.trtllm import compare_trtllm, steering_summary

            results, gpu_tokens, runs = compare_trtllm(
                config, on_outcome=lambda mode, _: progress.advance(tasks[mode])
            )
            from pbkv.engines.sim.costmodel import CostModel
            from pbkv.engines.sim.profile import load_hardware, load_model

            cost = CostModel(load_hardware(config.hardware), load_model(config.model))
            wanted = config.gpu_kv_tokens or gpu_tokens
            run = BenchRun(results, gpu_tokens, wanted, cost.gpu_kv_capacity_tokens, None)
        else:
            run = run_bench(config, on_outcome=lambda policy, _: progress.advance(tasks[policy]))
    colour = "yellow" if run.gpu_kv_capped else "dim"
    console.print(f"[{colour}]note:[/{colour}] {gpu_tier_note(run, config)}")
    console.print(
        comparison_table(
            run.results,
            _title(config, run.gpu_kv_tokens, engine, rate=run.rate),
            bounds=run.bounds,
        )
    )
    if engine == "trtllm-sim":
        for line in steering_summary(run.results, runs):
            console.print(line)
    else:
        console.print(f"[dim]{sim_cost_line(run.results)}[/dim]")
    return run


def _run_bench(args: argparse.Namespace, console: Console) -> int:
    from pbkv.bench.records import write_json

    if args.timeline and (not args.json_path or args.engine == "torch"):
        raise ValueError("--timeline writes the sim's hit timelines into --json: give --json PATH")
    check_writable(args.json_path)
    config = config_from(args)
    if args.engine == "torch":
        from pbkv.bench.torch_bench import config_from_bench, run_command

        torch_config = config_from_bench(config, args.model, args.repeats)
        return run_command(torch_config, console, args.json_path)
    if args.engine == "trtllm-sim":
        from pbkv.bench.trtllm import TRTLLM_MODES

        config = dataclasses.replace(config, policies=TRTLLM_MODES)
        run = _compare(config, console, engine="trtllm-sim")
    else:
        run = _compare(config, console)
    if args.json_path:
        write_json(
            args.json_path,
            config,
            run.gpu_kv_tokens,
            run.results,
            argv=args.argv,
            run=run,
            timeline=args.timeline,
        )
        console.print(f"wrote {args.json_path}")
    return exit_status(run.results, console)


def add_sweep(sub: argparse._SubParsersAction) -> None:
    from pbkv.bench.sweeps import PARAMETERS

    p = sub.add_parser(
        "sweep",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="sweep concurrency, score horizon K or prediction noise over one workload",
        description="Run the policies at each value of one parameter on the same workload; "
        "print a table, write JSON and a PNG plot.",
    )
    p.add_argument("parameter", choices=PARAMETERS)
    p.add_argument(
        "--values",
        type=float_list,
        default=None,
        help="comma-separated values (defaults: concurrency 2,4,8,16,32; horizon 1..5; "
        "noise 0,.1,.2,.3,.5)",
    )
    p.add_argument("--out-dir", default="out", help="folder for the JSON and PNG (default out/)")
    add_workload_options(p)
    p.set_defaults(run=_run_sweep)


_SWEEP_DEFAULTS: dict[str, list[float]] = {
    "concurrency": [2, 4, 8, 16, 32],
    "horizon": [1, 2, 3, 4, 5],
    "noise": [0.0, 0.1, 0.2, 0.3, 0.5],
}


def _run_sweep(args: argparse.Namespace, console: Console) -> int:
    from pbkv.bench.plots import plot_sweep
    from pbkv.bench.records import write_sweep_json
    from pbkv.bench.report import sweep_table
    from pbkv.bench.sweeps import sweep

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = config_from(args)
    if "lru" not in config.policies:  # the baseline of the ratio columns
        config = dataclasses.replace(config, policies=("lru", *config.policies))
    values = args.values or _SWEEP_DEFAULTS[args.parameter]
    with progress_bar(console) as progress:
        total = config.workflows * len(config.policies) * len(values)
        task = progress.add_task(f"sweep {args.parameter}", total=total)
        points = sweep(config, args.parameter, values, on_outcome=lambda *_: progress.advance(task))
    title = f"{config.app}: sweep of {args.parameter} ({config.workflows} workflows)"
    console.print(sweep_table(points, title))
    stem = out / f"sweep-{args.parameter}-{config.app}"
    write_sweep_json(stem.with_suffix(".json"), config, points, argv=args.argv)
    plot_sweep(points, stem.with_suffix(".png"), title)
    console.print(f"wrote {stem}.json and {stem}.png")
    return exit_status([r for p in points for r in p.results], console)


def add_trace_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace-plot",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="plot GPU hit rate over time per policy (paper Fig. 6)",
        description="Run the policies on one workload and plot each one's GPU hit rate over "
        "simulated time as a PNG.",
    )
    p.add_argument("--out", default="out/hit-timeline.png", help="PNG path")
    p.add_argument("--window", type=positive_int, default=50, help="moving-average invocations")
    add_workload_options(p)
    p.set_defaults(run=_run_trace_plot)


def _run_trace_plot(args: argparse.Namespace, console: Console) -> int:
    from pbkv.bench.plots import plot_hit_timeline

    check_writable(args.out)
    config = config_from(args)
    run = _compare(config, console)
    plot_hit_timeline(run.results, args.out, _title(config, run.gpu_kv_tokens), window=args.window)
    console.print(f"wrote {args.out}")
    return exit_status(run.results, console)
