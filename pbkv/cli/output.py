"""What a ``pbkv`` command shows and writes: its progress bar, an output path checked
writable before a long run, and its exit status."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def progress_bar(console: Console) -> Progress:
    """Return a transient progress display of finished-of-total workflows."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def check_writable(path: str | None) -> None:
    """Fail before a long run if ``path`` cannot be written; create its folder."""
    if path is None:
        return
    if not path.strip():
        raise ValueError("an empty path; give a file path")
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


def exit_status(results, console: Console) -> int:
    """Return 1 (and say so) when a workflow of ``results`` failed, else 0."""
    failed = sum(r.failed_workflows for r in results)
    if failed:
        console.print(f"[red]{failed} workflows failed[/red] (see the warnings above)")
        return 1
    return 0
