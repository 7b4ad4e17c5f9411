"""The predictor commands: ``pbkv trace generate|split``, ``pbkv train``,
``pbkv eval-predictor`` and ``pbkv bench-predictor`` (the work is in
:mod:`pbkv.predictor_commands`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from pbkv.cli.arguments import APP_HELP, positive_int
from pbkv.cli.output import check_writable


def add_predictor_commands(sub: argparse._SubParsersAction) -> None:
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
        "--workflows", type=positive_int, default=1000, help="workflows in the workload"
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
    train.add_argument("--horizon", type=positive_int, default=3, help="forecast steps K")
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
    ev.add_argument("--horizon", type=positive_int, default=3, help="forecast steps K")
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
    bp.add_argument("--batch", type=positive_int, default=1024, help="states per forecast batch")
    bp.add_argument("--repeats", type=positive_int, default=20, help="timed repetitions")
    bp.add_argument("--threads", type=positive_int, default=1, help="torch threads")
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

    check_writable(args.out)
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
    check_writable(str(Path(args.out) / "graphsage.json"))

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
    from pbkv.bench.records import command_line
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
    check_writable(args.json_path)
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
    from pbkv.bench.records import command_line
    from pbkv.predictor_commands import bench_predictor

    check_writable(args.json_path)
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
    parser.add_argument("--epochs", type=positive_int, default=30, help=f"training epochs{scope}")
    parser.add_argument(
        "--members",
        type=positive_int,
        default=1,
        help="models trained (seeds seed..seed+members-1) and averaged, a deep ensemble: "
        f"steadier and more accurate on small trace sets, members x the forecast cost{scope}",
    )
