"""``pbkv calibrate``: the torch engine measured here, and the sim hardware profile
that fits it."""

from __future__ import annotations

import argparse

from rich.console import Console

from pbkv.cli.arguments import positive_int


def add_calibrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="measure the torch engine here and write the sim hardware profile that fits it",
        description="Time prefill chunks of several sizes, pure decode steps at several "
        "batch sizes and contexts, decode steps that also carry a prefill chunk, and block "
        "copies between the pools on the torch engine's own forward. Fit the sim hardware "
        "profile's refined roofline to them: the per-step overhead, the weight read "
        "(memory bandwidth), the per-sequence overhead, the compute rate (peak FLOP/s), "
        "the share of a chunk's compute a decode step hides (overlap), and the host link "
        "from the copies. Prints each measured step beside the fitted sim's, then the "
        "profile as TOML; with --out, writes it to that file, which pbkv bench --hardware "
        "reads as a path, or by name once it is in engines/sim/profiles/ (as "
        "cpu-2core.toml is).",
    )
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a checkpoint folder")
    p.add_argument(
        "--out", default=None, help="TOML file to write the profile to (default: print it)"
    )
    p.add_argument("--name", default=None, help="profile name (default: --out's stem)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads")
    p.add_argument("--prefill-tokens", type=positive_int, default=512, help="chunk timed")
    p.add_argument("--steps", type=positive_int, default=8, help="decode steps per point")
    p.add_argument("--repeats", type=positive_int, default=3, help="prefill chunks timed")
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
