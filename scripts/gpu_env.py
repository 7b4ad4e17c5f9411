"""Make pbkv importable on a bare machine from a carried wheelhouse, without pip or an index.

    python scripts/gpu_env.py --wheelhouse build/gpu/wheelhouse --target /tmp/pbkv-site

Prints the folder to put first on ``PYTHONPATH``. In it:

- each distribution pinned in ``WHEELHOUSE/requirements.txt`` that this Python lacks,
  unpacked from the wheel that fits this interpreter (a wheel is a zip of what
  ``site-packages`` would hold; ``packaging.tags``, which transformers brings, says
  which wheels fit; one already installed, at any version, is left alone);
- ``pbkv/``: the package as ``pyproject.toml``'s ``package-dir`` maps it, made of
  symbolic links into this checkout (what an editable install does, with nothing
  written to the interpreter's own folders).

Standard library only (``packaging`` if present). Exits 1 naming what it cannot provide.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import shutil
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def supported_tags() -> set[tuple[str, str, str]]:
    """``(interpreter, abi, platform)`` tags this Python accepts."""
    try:
        from packaging.tags import sys_tags
    except ImportError:  # a minimal set: CPython x86_64 Linux and pure wheels
        v = f"{sys.version_info.major}{sys.version_info.minor}"
        plats = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"]
        tags = {(f"cp{v}", f"cp{v}", p) for p in plats}
        tags |= {(py, "none", "any") for py in ("py3", f"py{v}", f"cp{v}", "py2.py3")}
        return tags
    return {(t.interpreter, t.abi, t.platform) for t in sys_tags()}


def wheel_fits(filename: str, tags: set[tuple[str, str, str]]) -> bool:
    """Whether a wheel's compressed tag set (``py2.py3-none-any``) meets ``tags``."""
    parts = filename[: -len(".whl")].split("-")
    if len(parts) < 5:
        return False
    pys, abis, plats = parts[-3].split("."), parts[-2].split("."), parts[-1].split(".")
    return any((p, a, pl) in tags for p in pys for a in abis for pl in plats)


def pick_wheel(wheelhouse: Path, name: str, version: str, tags) -> Path | None:
    """The wheel of ``name==version`` in ``wheelhouse`` that fits ``tags``, if any."""
    for path in sorted(wheelhouse.glob("*.whl")):
        dist, wheel_version = path.name.split("-")[:2]
        same = _normalize(dist) == _normalize(name) and wheel_version == version
        if same and wheel_fits(path.name, tags):
            return path
    return None


def installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def unpack_missing(wheelhouse: Path, target: Path) -> list[str]:
    """Unpack each pinned distribution this Python lacks; return what was unpacked.

    Raises:
        SystemExit: a missing distribution has no wheel for this interpreter.
    """
    tags = supported_tags()
    done = []
    for line in (wheelhouse / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        if installed(name):
            continue
        wheel = pick_wheel(wheelhouse, name, version, tags)
        if wheel is None:
            py = f"{sys.version_info.major}.{sys.version_info.minor}"
            sys.exit(
                f"gpu_env: no wheel of {name}=={version} for Python {py} in {wheelhouse}; "
                f"rebuild it here with: scripts/gpu_wheelhouse.sh {py}"
            )
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(target)
        done.append(wheel.name)
    return done


def link_pbkv(target: Path, root: Path = ROOT) -> Path:
    """Build ``target/pbkv`` from symbolic links, as ``package-dir`` in pyproject maps it.

    Raises:
        ValueError: a nested package's folder is not inside its parent's.
    """
    import tomllib  # after main's version check: 3.11+

    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = setuptools["package-dir"]
    top = target / "pbkv"
    shutil.rmtree(top, ignore_errors=True)
    top.mkdir(parents=True)
    for child in (root / mapping["pbkv"]).iterdir():
        if child.name != "__pycache__":
            (top / child.name).symlink_to(child)
    for package, folder in sorted(mapping.items()):
        parts = package.split(".")
        if len(parts) < 2:
            continue
        parent = ".".join(parts[:-1])
        expected = f"{mapping.get(parent, parent.replace('.', '/'))}/{parts[-1]}"
        if len(parts) == 2 and not (top / parts[-1]).exists():
            (top / parts[-1]).symlink_to(root / folder)
        elif len(parts) > 2 and Path(folder) != Path(expected):
            raise ValueError(f"{package} maps to {folder}, not inside {expected}")
    return top


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "build/gpu/wheelhouse")
    parser.add_argument("--target", type=Path, default=Path("/tmp/pbkv-site"))
    args = parser.parse_args(argv)
    if sys.version_info < (3, 11):  # noqa: UP036 - says so on an older machine Python
        sys.exit(f"gpu_env: pbkv needs Python 3.11 or newer, this is {sys.version.split()[0]}")
    args.target.mkdir(parents=True, exist_ok=True)
    unpacked = unpack_missing(args.wheelhouse, args.target)
    link_pbkv(args.target)
    print(f"gpu_env: unpacked {', '.join(unpacked) or 'nothing'}", file=sys.stderr)
    print(args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
