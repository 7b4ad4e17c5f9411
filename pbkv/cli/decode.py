"""``pbkv bench-decode``: the torch engine's batched decode beside plain transformers'."""

from __future__ import annotations

import argparse

from rich.console import Console

from pbkv.cli.arguments import count_list, positive_int


def add_bench_decode(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench-decode",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="time the torch engine's batched decode beside plain transformers' (same "
        "model, threads and prompts)",
        description="Decode --batch random prompts of each context length for --steps "
        "greedy steps, with plain transformers (one batched cache) and with the torch "
        "engine (its scheduler, paged KV and sampling included), runs alternated (plain "
        "first and last), and print each one's time per step and the engine's ratio to "
        "plain, in wall-clock and process CPU time (medians of the runs).",
    )
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a checkpoint folder")
    p.add_argument("--batch", type=positive_int, default=8, help="sequences decoding together")
    p.add_argument(
        "--contexts", type=count_list, default=[512, 2048], help="prompt lengths, comma-separated"
    )
    p.add_argument("--steps", type=positive_int, default=16, help="decode steps timed a run")
    p.add_argument("--repeats", type=positive_int, default=3, help="engine runs per context")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads")
    p.add_argument("--device", default=None, help="torch device (default: CUDA if visible)")
    p.set_defaults(run=_run_bench_decode)


def _run_bench_decode(args: argparse.Namespace, console: Console) -> int:
    import torch
    from rich.table import Table

    from pbkv.engines.torchengine.measure import decode_comparison
    from pbkv.engines.torchengine.model import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, device=args.device)
    device = next(model.parameters()).device
    table = Table(
        title=f"batched decode, {args.model} on {device}, batch {args.batch}, "
        f"{torch.get_num_threads()} threads (medians; x plain: the engine's time over plain's)"
    )
    for header in ("context", "plain ms/step", "engine ms/step", "x plain wall", "x plain CPU"):
        table.add_column(header, justify="right")
    for context in args.contexts:
        result = decode_comparison(
            model, batch=args.batch, context_tokens=context, steps=args.steps, repeats=args.repeats
        )
        table.add_row(
            f"{context:,}",
            f"{result.plain_step_s * 1e3:.1f}",
            f"{result.engine_step_s * 1e3:.1f}",
            f"{result.ratio:.2f}",
            f"{result.cpu_ratio:.2f}",
        )
    console.print(table)
    return 0
