"""Where the real traces live: bundled in the package (``pbkv/data``), or ``$PBKV_DATA_DIR``."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

DATA_DIR_ENV = "PBKV_DATA_DIR"
BUNDLED_DATA_DIR = Path(__file__).resolve().parent.parent / "data"
"""The traces shipped with pbkv (``data/`` in the checkout, ``pbkv/data/`` when installed)."""


def find_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the data directory: ``data_dir``, else ``$PBKV_DATA_DIR``, else the bundled one.

    Args:
        data_dir: an explicit directory; it must exist.

    Returns:
        The directory's absolute path; it holds ``taubench/`` and ``mooncake/``.

    Raises:
        FileNotFoundError: the explicit or configured directory does not exist, or the
            bundled one is missing (a broken install).
    """
    for explicit, origin in ((data_dir, "data_dir"), (os.environ.get(DATA_DIR_ENV), DATA_DIR_ENV)):
        if explicit:
            path = Path(explicit).expanduser().resolve()
            if not path.is_dir():
                raise FileNotFoundError(f"{origin}={str(explicit)!r} is not a directory")
            return path
    if not BUNDLED_DATA_DIR.is_dir():
        raise FileNotFoundError(
            f"the bundled traces are missing ({BUNDLED_DATA_DIR}); reinstall pbkv or set "
            f"{DATA_DIR_ENV} to a folder holding taubench/ and mooncake/"
        )
    return BUNDLED_DATA_DIR


def find_data_file(
    relative: str | os.PathLike[str], data_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Return ``relative`` inside the data directory, or its gzip copy ``relative + ".gz"``.

    The uncompressed file wins when both exist.

    Raises:
        FileNotFoundError: neither exists (names both paths), or as :func:`find_data_dir`.
    """
    plain = find_data_dir(data_dir) / relative
    for path in (plain, plain.with_name(plain.name + ".gz")):
        if path.is_file():
            return path
    raise FileNotFoundError(f"{plain} not found (nor {plain.name}.gz beside it)")


def read_data_text(path: Path) -> str:
    """Return the UTF-8 text of ``path``, gunzipped when its name ends in ``.gz``.

    Raises:
        ValueError: a ``.gz`` file is not valid gzip (names the file).
    """
    if path.suffix != ".gz":
        return path.read_text(encoding="utf-8")
    try:
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a valid gzip file: {exc}") from exc
