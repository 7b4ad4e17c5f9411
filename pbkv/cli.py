"""The pbkv command line: `pbkv bench` compares cache policies on one workload, `pbkv serve`
serves an OpenAI-compatible API."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

log = logging.getLogger(__name__)

# torch's OpenMP threads spin while waiting; on a loaded 2-core machine that cuts CPU
# prefill from ~150 to ~20 tokens/s. Must be set before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _float_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def _policies(text: str) -> tuple[str, ...]:
    from pbkv.engines.scheduler import SCHEDULERS
    from pbkv.kvmanager import POLICIES

    listed = [p.strip() for p in text.split(",")]
    if not all(listed):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated policy names, got {text!r} (an empty entry)"
        )
    names = tuple(dict.fromkeys(listed))
    if len(names) < len(listed):
        twice = sorted({n for n in listed if listed.count(n) > 1})
        raise argparse.ArgumentTypeError(f"{', '.join(twice)} listed more than once")
    unknown = [n for n in names if n.partition(":")[0] not in POLICIES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown)}; known: {', '.join(POLICIES)}"
        )
    bad = [n for n in names if n.partition(":")[2] not in ("", *SCHEDULERS)]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown scheduler in {', '.join(bad)}; known: {', '.join(SCHEDULERS)}"
        )
    return names


def _add_workload_options(p: argparse.ArgumentParser) -> None:
    from pbkv.bench.compare import BenchConfig
    from pbkv.engines.scheduler import SCHEDULERS

    d = BenchConfig()
    p.add_argument("--app", default=d.app, help=APP_HELP)
    p.add_argument(
        "--policies",
        type=_policies,
        default=",".join(d.policies),
        help="comma-separated policies (also lae, he, kvflow, belady-est, pbkv-aggressive, "
        "and the 2025-26 baselines continuum, autellix, markov-survival); name:scheduler "
        "picks a row's scheduler, e.g. lru:workflow",
    )
    p.add_argument(
        "--scheduler",
        choices=tuple(SCHEDULERS),
        default=None,
        help="admission scheduler for every policy not naming one (default: pbkv and "
        "pbkv-aggressive run workflow, the others fcfs); workflow-retract also pauses "
        "younger workflows' running requests for the one that must go next; "
        "fcfs-balanced is fcfs with workflow's stall-free batches",
    )
    p.add_argument(
        "--workflows", type=_positive_int, default=d.workflows, help="workflows in the workload"
    )
    p.add_argument(
        "--concurrency",
        type=_positive_int,
        default=d.concurrency,
        help="workflows in flight at once",
    )
    p.add_argument(
        "--open-loop",
        action="store_true",
        help="start each workflow at its arrival time (concurrency still caps those in "
        "flight); mooncake always runs open loop",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open loop: Poisson session arrivals at this many workflows per second "
        "(latency counts from arrival; --concurrency caps the sessions open at once)",
    )
    p.add_argument(
        "--load",
        type=float,
        default=None,
        help="open loop at this fraction of the strongest baseline's capacity "
        "(lru:workflow's closed-loop throughput at --concurrency, measured first)",
    )
    p.add_argument(
        "--gap-scale",
        type=float,
        default=1.0,
        help="factor on every tool and think gap of the workload (e.g. 10: agents wait ten "
        "times longer on tools and users)",
    )
    p.add_argument(
        "--slo-s",
        type=float,
        default=None,
        help="workflow latency target: each row also reports its goodput (workflows per "
        "second within it)",
    )
    p.add_argument(
        "--gpu-kv-tokens",
        type=_positive_int,
        default=None,
        help="GPU KV capacity in tokens (default: half the concurrent working set, capped "
        "by the hardware profile's KV capacity)",
    )
    p.add_argument(
        "--host-kv-tokens",
        type=int,
        default=None,
        help="host tier in tokens (default: 2x the GPU tier, as SGLang HiCache)",
    )
    p.add_argument(
        "--host-tier",
        choices=("write-through", "exclusive"),
        default=d.host_tier,
        help="host tier model: write-through (default; SGLang HiCache, the paper's "
        "baseline: the host keeps a copy of what is on the GPU) or exclusive "
        "(TensorRT-LLM: a block is offloaded when the GPU evicts it)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="random seed")
    p.add_argument(
        "--predictor",
        default=d.predictor,
        help="forecaster for he/pbkv: online (default: learns as the row runs, what "
        "open_runtime and pbkv serve run), or fitted before the run on --train-workflows: "
        "markov, markov-1..3, graphsage, oracle, uniform",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="GraphSAGE checkpoint folder (pbkv train); without one, graphsage is trained "
        "on the --train-workflows traces without text",
    )
    p.add_argument(
        "--noise",
        type=float,
        default=d.noise,
        help="prediction noise lambda in [0, 1]: P~ = (1-lambda) P + lambda U",
    )
    p.add_argument(
        "--train-workflows",
        type=_positive_int,
        default=d.train_workflows,
        help="workflows (another seed) the predictor is fitted on",
    )
    from pbkv.engines.sim.profile import list_profiles

    shipped = list_profiles()
    p.add_argument(
        "--hardware",
        default=d.hardware,
        help=f"hardware profile: {', '.join(shipped.hardware)} or a TOML file",
    )
    p.add_argument(
        "--model", default=d.model, help=f"model profile: {', '.join(shipped.model)} or a TOML file"
    )
    p.add_argument(
        "--block-size", type=_positive_int, default=d.block_size, help="tokens per KV block"
    )
    p.add_argument("--horizon", type=_positive_int, default=d.horizon, help="score horizon K")
    p.add_argument("--gamma", type=float, default=d.gamma, help="score decay in (0, 1]")
    p.add_argument(
        "--check-integrity",
        action="store_true",
        help="assert the KV manager's invariants after every engine step (slow)",
    )


def _config_from(args: argparse.Namespace):  # -> BenchConfig
    from pbkv.bench.compare import BenchConfig
    from pbkv.examples import get_app

    if args.host_kv_tokens is not None and args.host_kv_tokens < 0:
        raise ValueError(f"--host-kv-tokens must be >= 0, got {args.host_kv_tokens}")
    if not 0.0 <= args.noise <= 1.0:
        raise ValueError(f"--noise must be in [0, 1], got {args.noise}")
    return BenchConfig(
        app=args.app,
        policies=args.policies,
        workflows=args.workflows,
        concurrency=args.concurrency,
        gpu_kv_tokens=args.gpu_kv_tokens,
        host_kv_tokens=args.host_kv_tokens,
        host_tier=args.host_tier,
        rate=args.rate,
        load=args.load,
        slo_s=args.slo_s,
        gap_scale=args.gap_scale,
        seed=args.seed,
        predictor=args.predictor,
        train_workflows=args.train_workflows,
        hardware=args.hardware,
        model=args.model,
        block_size=args.block_size,
        horizon=args.horizon,
        gamma=args.gamma,
        noise=args.noise,
        checkpoint=args.checkpoint,
        check_integrity=args.check_integrity,
        scheduler=args.scheduler,
        # what run_bench does, so the JSON's config says how the run went
        open_loop=args.open_loop or bool(getattr(get_app(args.app), "open_loop", False)),
    )


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="compare cache policies on one generated workload (virtual-time engine)",
        description="Serve the same workload under each policy through the actor system on the "
        "virtual-time engine and print one table (ratios vs lru).",
    )
    _add_workload_options(p)
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
        type=_positive_int,
        default=3,
        help="torch: runs of every row, in rotated order (spreads over them)",
    )
    p.add_argument("--json", dest="json_path", default=None, help="write results to this JSON file")
    p.set_defaults(run=_run_bench)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _check_writable(path: str | None) -> None:
    """Fail before a long run if ``path`` cannot be written; create its folder."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{path} is a folder; give a file path")
    try:
        target.resolve().parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{path}: cannot create its folder ({exc.strerror})") from None
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as exc:
        raise ValueError(f"{path}: cannot write it ({exc.strerror})") from None
    if not existed:
        target.unlink()


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
    from pbkv.bench.compare import BenchRun, run_bench
    from pbkv.bench.report import comparison_table, gpu_tier_note, sim_cost_line

    labels = (*config.policies, "uncontested") if engine == "sim" else config.policies
    with _progress(console) as progress:
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
    from pbkv.bench.report import write_json

    _check_writable(args.json_path)
    config = _config_from(args)
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
        write_json(args.json_path, config, run.gpu_kv_tokens, run.results, argv=args.argv, run=run)
        console.print(f"wrote {args.json_path}")
    return _exit_status(run.results, console)


def _exit_status(results, console: Console) -> int:
    failed = sum(r.failed_workflows for r in results)
    if failed:
        console.print(f"[red]{failed} workflows failed[/red] (see the warnings above)")
        return 1
    return 0


def _add_sweep(sub: argparse._SubParsersAction) -> None:
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
        type=_float_list,
        default=None,
        help="comma-separated values (defaults: concurrency 2,4,8,16,32; horizon 1..5; "
        "noise 0,.1,.2,.3,.5)",
    )
    p.add_argument("--out-dir", default="out", help="folder for the JSON and PNG (default out/)")
    _add_workload_options(p)
    p.set_defaults(run=_run_sweep)


_SWEEP_DEFAULTS: dict[str, list[float]] = {
    "concurrency": [2, 4, 8, 16, 32],
    "horizon": [1, 2, 3, 4, 5],
    "noise": [0.0, 0.1, 0.2, 0.3, 0.5],
}


def _run_sweep(args: argparse.Namespace, console: Console) -> int:
    from pbkv.bench.plots import plot_sweep
    from pbkv.bench.report import sweep_table, write_sweep_json
    from pbkv.bench.sweeps import sweep

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = _config_from(args)
    if "lru" not in config.policies:  # the baseline of the ratio columns
        config = dataclasses.replace(config, policies=("lru", *config.policies))
    values = args.values or _SWEEP_DEFAULTS[args.parameter]
    with _progress(console) as progress:
        total = config.workflows * len(config.policies) * len(values)
        task = progress.add_task(f"sweep {args.parameter}", total=total)
        points = sweep(config, args.parameter, values, on_outcome=lambda *_: progress.advance(task))
    title = f"{config.app}: sweep of {args.parameter} ({config.workflows} workflows)"
    console.print(sweep_table(points, title))
    stem = out / f"sweep-{args.parameter}-{config.app}"
    write_sweep_json(stem.with_suffix(".json"), config, points, argv=args.argv)
    plot_sweep(points, stem.with_suffix(".png"), title)
    console.print(f"wrote {stem}.json and {stem}.png")
    return _exit_status([r for p in points for r in p.results], console)


def _add_trace_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace-plot",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="plot GPU hit rate over time per policy (paper Fig. 6)",
        description="Run the policies on one workload and plot each one's GPU hit rate over "
        "simulated time as a PNG.",
    )
    p.add_argument("--out", default="out/hit-timeline.png", help="PNG path")
    p.add_argument("--window", type=_positive_int, default=50, help="moving-average invocations")
    _add_workload_options(p)
    p.set_defaults(run=_run_trace_plot)


def _run_trace_plot(args: argparse.Namespace, console: Console) -> int:
    from pbkv.bench.plots import plot_hit_timeline

    _check_writable(args.out)
    config = _config_from(args)
    run = _compare(config, console)
    plot_hit_timeline(run.results, args.out, _title(config, run.gpu_kv_tokens), window=args.window)
    console.print(f"wrote {args.out}")
    return _exit_status(run.results, console)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from pbkv.demo import DemoConfig

    d = DemoConfig()
    p = sub.add_parser(
        "demo",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="a live app (Planner -> Coder -> tests run for real) on SmolLM2, lru vs pbkv",
        description="Serve the live-codegen app on a real model: routing follows what the "
        "model writes, the tester runs the generated code's tests in a subprocess. Every "
        "policy serves the same tasks; prints the wall-clock comparison and the path each "
        "workflow took. A few minutes on a 2-core CPU; on CUDA when a GPU is visible.",
    )
    p.add_argument("--model", default=d.model, help="smollm2, tiny or a checkpoint folder")
    p.add_argument(
        "--policies", type=_policies, default=",".join(d.policies), help="comma-separated policies"
    )
    p.add_argument("--workflows", type=_positive_int, default=d.workflows, help="tasks served")
    p.add_argument(
        "--concurrency", type=_positive_int, default=d.concurrency, help="workflows in flight"
    )
    p.add_argument(
        "--gpu-kv-tokens",
        type=_positive_int,
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
        "--code-tokens", type=_positive_int, default=d.code_tokens, help="Coder decode budget"
    )
    p.add_argument(
        "--context-tokens",
        type=int,
        default=d.context_tokens,
        help="about this many tokens of reference per task (a module's docs; 0: none)",
    )
    p.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        help="runs of every policy, rotated (the gain is printed with its spread)",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the dry runs")
    p.add_argument("--json", dest="json_path", default=None, help="also write results here")
    p.add_argument(
        "--traces", default=None, help="append the live runs' traces here (JSONL, pbkv train)"
    )
    p.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace, console: Console) -> int:
    from pbkv.actors.traces import TraceRecorder
    from pbkv.bench.report import command_line, comparison_table
    from pbkv.demo import (
        DemoConfig,
        demo_record,
        first_runs,
        gain_verdict,
        paths_table,
        repeats_table,
        run_demo,
    )

    _check_writable(args.json_path)
    _check_writable(args.traces)
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
    )
    recorder = TraceRecorder(args.traces, keep=False) if args.traces else None
    try:
        with _progress(console) as progress:
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
        f"{demo.model} on {demo.device} (wall-clock seconds)"
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
    return _exit_status(results, console)


def _add_predictor_commands(sub: argparse._SubParsersAction) -> None:
    trace = sub.add_parser(
        "trace",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="generate or split workflow traces (JSONL)",
    )
    tsub = trace.add_subparsers(dest="trace_command", required=True)
    gen = tsub.add_parser(
        "generate",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="write an app's generated workflows as traces",
    )
    gen.add_argument("--app", required=True, help=APP_HELP)
    gen.add_argument(
        "--workflows", type=_positive_int, default=1000, help="workflows in the workload"
    )
    gen.add_argument("--seed", type=int, default=0, help="random seed")
    gen.add_argument("--out", required=True, help="JSONL file to write")
    gen.set_defaults(run=_run_trace_generate)
    split = tsub.add_parser(
        "split",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="split a trace file into train and held-out files",
    )
    split.add_argument("traces")
    split.add_argument("--train-out", required=True, help="where the training part goes (JSONL)")
    split.add_argument("--test-out", required=True, help="where the held-out part goes (JSONL)")
    split.add_argument("--test-fraction", type=float, default=0.25, help="share of tasks held out")
    split.add_argument("--seed", type=int, default=0, help="random seed")
    split.add_argument(
        "--no-by-task",
        dest="by_task",
        action="store_false",
        help="split workflows freely (default keeps a task's trials together)",
    )
    _add_strict(split)
    split.set_defaults(run=_run_trace_split)

    train = sub.add_parser(
        "train",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="train the GraphSAGE predictor on traces",
    )
    train.add_argument("--app", required=True, help=APP_HELP)
    train.add_argument("--traces", required=True, help="training traces (JSONL)")
    train.add_argument("--out", required=True, help="checkpoint folder")
    train.add_argument("--horizon", type=_positive_int, default=3, help="forecast steps K")
    _add_fit_arguments(train, "")
    train.add_argument("--seed", type=int, default=0, help="random seed")
    _add_strict(train)
    train.set_defaults(run=_run_train)

    ev = sub.add_parser(
        "eval-predictor",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="top-1 accuracy per step and END Brier score",
        description="Score forecasters on held-out traces (--traces with --checkpoint and/or "
        "--train-traces), or cross-validate them by task over one trace file (--folds). "
        "Predictors: markov, markov-1..3, graphsage, graphsage-notext (its text withheld), "
        "oracle, uniform. graphsage is trained here with --folds, or with --train-traces "
        "and no --checkpoint (--text-encoder ... --members set that fit; a checkpoint keeps "
        "its own); with --text-encoder none, graphsage-notext is refused.",
    )
    ev.add_argument("--app", required=True, help=APP_HELP)
    ev.add_argument(
        "--traces", required=True, help="held-out traces (JSONL); with --folds, all the traces"
    )
    ev.add_argument(
        "--predictors",
        default="markov-1,markov-3,graphsage",
        help="comma-separated forecasters (graphsage-notext withholds the text)",
    )
    ev.add_argument(
        "--train-traces",
        default=None,
        help="traces the Markov models (and a graphsage without --checkpoint) are fitted on "
        "(default with --checkpoint: the traces file its sidecar names)",
    )
    ev.add_argument("--checkpoint", default=None, help="GraphSAGE checkpoint folder")
    ev.add_argument("--horizon", type=_positive_int, default=3, help="forecast steps K")
    ev.add_argument(
        "--folds",
        type=int,
        default=0,
        help="cross-validate over the tasks of --traces with this many folds (>= 2); every "
        "predictor is trained on the other folds (0: --traces are held out)",
    )
    _add_fit_arguments(ev, ", for a graphsage trained here")
    ev.add_argument(
        "--seed", type=int, default=0, help="fold deal and seed of a graphsage trained here"
    )
    ev.add_argument("--json", dest="json_path", default=None, help="also write scores here")
    _add_strict(ev)
    ev.set_defaults(run=_run_eval_predictor)

    bp = sub.add_parser(
        "bench-predictor",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="forecast latency for a batch of states",
    )
    bp.add_argument("--checkpoint", required=True, help="GraphSAGE checkpoint folder")
    bp.add_argument("--batch", type=_positive_int, default=1024, help="states per forecast batch")
    bp.add_argument("--repeats", type=_positive_int, default=20, help="timed repetitions")
    bp.add_argument("--threads", type=_positive_int, default=1, help="torch threads")
    bp.add_argument("--json", dest="json_path", default=None, help="also write the timing here")
    _add_strict(bp)
    bp.set_defaults(run=_run_bench_predictor)


def _add_strict(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse a traces file at its first bad line (default: skip bad lines, warn)",
    )


def _run_trace_generate(args: argparse.Namespace, console: Console) -> int:
    from pbkv.predictor_commands import trace_generate

    _check_writable(args.out)
    console.print(trace_generate(args.app, args.workflows, args.seed, args.out))
    return 0


def _run_trace_split(args: argparse.Namespace, console: Console) -> int:
    from pbkv.predictor_commands import trace_split

    console.print(
        trace_split(
            args.traces,
            args.train_out,
            args.test_out,
            test_fraction=args.test_fraction,
            seed=args.seed,
            by_task=args.by_task,
            strict=args.strict,
        )
    )
    return 0


def _check_app(app: str, traces: str, strict: bool) -> None:
    """Fail early, by name, when ``traces`` were recorded for another app (or, with
    ``strict``, hold a bad line). Quiet: the command's own read warns of bad lines."""
    from pbkv.predictor.trace import read_traces

    if ":" in app:  # a user's "module:attribute": its traces carry the app's name
        from pbkv.examples import get_app

        app = get_app(app).name
    apps = {r.app for r in read_traces(traces, strict=strict, warn=False).records}
    if apps and apps != {app}:
        raise ValueError(f"{traces} holds traces of {', '.join(sorted(apps))}, not {app}")


def _run_train(args: argparse.Namespace, console: Console) -> int:
    from pbkv.predictor_commands import train

    _check_app(args.app, args.traces, args.strict)
    _check_writable(str(Path(args.out) / "graphsage.json"))

    encoder = None if args.text_encoder == "none" else args.text_encoder
    console.print(
        train(
            args.app,
            args.traces,
            args.out,
            epochs=args.epochs,
            horizon=args.horizon,
            text_encoder=encoder,
            text_source=args.text_source,
            seed=args.seed,
            members=args.members,
            strict=args.strict,
            console=console,
        )
    )
    return 0


def _run_eval_predictor(args: argparse.Namespace, console: Console) -> int:
    from pbkv.bench.report import command_line
    from pbkv.predictor_commands import eval_predictor

    names = [n.strip() for n in args.predictors.split(",") if n.strip()]
    learned = [n for n in names if n.startswith("graphsage")]
    if args.folds == 1 or args.folds < 0:
        raise ValueError(f"--folds must be 0 (off) or >= 2, got {args.folds}")
    fit = (args.text_encoder, args.text_source, args.epochs, args.members)
    if args.checkpoint and fit != ("smollm2", "task", 30, 1):
        raise ValueError(
            "--text-encoder/--text-source/--epochs/--members configure a graphsage trained "
            "here; a --checkpoint keeps what its sidecar says"
        )
    if learned and not args.folds and args.checkpoint is None and args.train_traces is None:
        raise ValueError(
            f"{learned[0]} needs --checkpoint (from pbkv train), --train-traces to train one, "
            "or --folds to cross-validate"
        )
    _check_app(args.app, args.traces, args.strict)
    if args.train_traces:
        _check_app(args.app, args.train_traces, args.strict)
    _check_writable(args.json_path)
    console.print(
        eval_predictor(
            args.app,
            args.traces,
            names,
            train_traces=args.train_traces,
            checkpoint=args.checkpoint,
            horizon=args.horizon,
            folds=args.folds,
            text_encoder=None if args.text_encoder == "none" else args.text_encoder,
            text_source=args.text_source,
            seed=args.seed,
            epochs=args.epochs,
            members=args.members,
            json_path=args.json_path,
            strict=args.strict,
            console=Console(stderr=True),
            command=command_line(args.argv),
        )
    )
    if args.json_path:
        console.print(f"wrote {args.json_path}")
    return 0


def _run_bench_predictor(args: argparse.Namespace, console: Console) -> int:
    from pbkv.bench.report import command_line
    from pbkv.predictor_commands import bench_predictor

    _check_writable(args.json_path)
    console.print(
        bench_predictor(
            args.checkpoint,
            batch=args.batch,
            repeats=args.repeats,
            threads=args.threads,
            json_path=args.json_path,
            command=command_line(args.argv),
            strict=args.strict,
        )
    )
    if args.json_path:
        console.print(f"wrote {args.json_path}")
    return 0


APP_HELP = (
    "app: codegen, hover, swebench, financebench, groupchat, toolloop, taubench, mooncake "
    "(the Mooncake conversation trace as unlabeled open-loop traffic; its long prompts want "
    "--hardware h200 --model qwen3-14b), or a user's app as "
    "module:attribute (a pbkv.live.App, or a factory of one, in an importable module)"
)


def _add_fit_arguments(parser: argparse.ArgumentParser, scope: str) -> None:
    """Add the GraphSAGE fit options (``scope`` ends each help text: whose fit)."""
    parser.add_argument(
        "--text-encoder",
        default="smollm2",
        help=f"smollm2, minilm, hashing or none (no h_txt){scope}",
    )
    parser.add_argument(
        "--text-source",
        choices=("task", "step"),
        default="task",
        help=f"embed the task text, or each step's newest context text (falling back to the "
        f"task){scope}",
    )
    parser.add_argument("--epochs", type=_positive_int, default=30, help=f"training epochs{scope}")
    parser.add_argument(
        "--members",
        type=_positive_int,
        default=1,
        help="models trained (seeds seed..seed+members-1) and averaged, a deep ensemble: "
        f"steadier and more accurate on small trace sets, members x the forecast cost{scope}",
    )


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


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="measure the torch engine here and write the sim hardware profile that fits it",
        description="Time a prefill chunk, pure decode steps and block copies on the torch "
        "engine, fit the sim's roofline rates to them, print each measured step beside the "
        "fitted sim's, and write the profile (e.g. engines/sim/profiles/cpu-2core.toml).",
    )
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a checkpoint folder")
    p.add_argument("--out", default=None, help="profile file to write (default: print it)")
    p.add_argument("--name", default=None, help="profile name (default: --out's stem)")
    p.add_argument("--threads", type=_positive_int, default=None, help="torch threads")
    p.add_argument("--prefill-tokens", type=_positive_int, default=512, help="chunk timed")
    p.add_argument("--steps", type=_positive_int, default=8, help="decode steps per point")
    p.add_argument("--repeats", type=_positive_int, default=3, help="prefill chunks timed")
    p.add_argument("--device", default=None, help="torch device (default: CUDA if visible)")
    p.set_defaults(run=_run_calibrate)


def _run_calibrate(args: argparse.Namespace, console: Console) -> int:
    import torch

    from pbkv.engines.torchengine.calibrate import run_command

    if args.threads:
        torch.set_num_threads(args.threads)
    return run_command(
        args.model,
        args.out,
        console,
        profile_name=args.name,
        prefill_tokens=args.prefill_tokens,
        steps=args.steps,
        repeats=args.repeats,
        device=args.device,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pbkv", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench(sub)
    _add_sweep(sub)
    _add_trace_plot(sub)
    _add_demo(sub)
    _add_calibrate(sub)
    _add_predictor_commands(sub)
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


if __name__ == "__main__":
    sys.exit(main())
