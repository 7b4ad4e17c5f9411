"""Argument types of the ``pbkv`` commands: positive counts, number lists, policy specs,
and the ``--app`` help."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """Parse a count of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def float_list(text: str) -> list[float]:
    """Parse comma-separated numbers (at least one)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def count_list(text: str) -> list[int]:
    """Parse comma-separated counts, each at least 1."""
    try:
        return [positive_int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 512,2048, got {text!r}") from None


def policy_specs(text: str) -> tuple[str, ...]:
    """Parse comma-separated policy specs (``name`` or ``name:scheduler``), each known
    and listed once."""
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


APP_HELP = (
    "app: codegen, hover, swebench, financebench, groupchat, toolloop, taubench, mooncake "
    "(the Mooncake conversation trace as unlabeled open-loop traffic; its long prompts want "
    "--hardware h200 --model qwen3-14b), or a user's app as "
    "module:attribute (a pbkv.live.App, or a factory of one, in an importable module)"
)
