"""Where the shared real traces live (``shared/data``, kept outside the project)."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "PBKV_DATA_DIR"
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


def find_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the shared data directory.

    Looks, in order, at ``data_dir``, at ``$PBKV_DATA_DIR``, then for a ``shared/data``
    folder in the project root, the working directory, or any folder above them (the
    checkout keeps it at ``../shared/data`` relative to the project root).

    Args:
        data_dir: an explicit directory; it must exist.

    Returns:
        The directory's absolute path.

    Raises:
        FileNotFoundError: the explicit or configured directory does not exist, or no
            ``shared/data`` folder is found (the message lists where it looked).
    """
    for explicit, origin in ((data_dir, "data_dir"), (os.environ.get(DATA_DIR_ENV), DATA_DIR_ENV)):
        if explicit:
            path = Path(explicit).expanduser().resolve()
            if not path.is_dir():
                raise FileNotFoundError(f"{origin}={str(explicit)!r} is not a directory")
            return path
    starts = tuple(dict.fromkeys((_PROJECT_ROOT, Path.cwd().resolve())))
    for start in starts:
        for folder in (start, *start.parents):
            candidate = folder / "shared" / "data"
            if candidate.is_dir():
                return candidate
    raise FileNotFoundError(
        "no shared/data folder found above "
        + " or ".join(str(s) for s in starts)
        + f"; pass data_dir= or set {DATA_DIR_ENV} to the folder holding taubench/ and mooncake/"
    )
