"""The layout follows the runtime (issue 10 item 7): who may import whom, checked on the source."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at top level or inside functions (relative ones resolved)."""
    package = "pbkv." + ".".join(path.relative_to(ROOT).parent.parts)
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def offenders(folder: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        bad = sorted(
            m
            for m in imported_modules(path)
            if any(m == f or m.startswith(f + ".") for f in forbidden)
        )
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_engines_import_nothing_from_actors_bench_or_examples():
    assert offenders("engines", ("pbkv.actors", "pbkv.bench", "pbkv.examples")) == {}


@pytest.mark.parametrize("folder", ["engines", "predictor", "live"])
def test_library_code_imports_no_command_line_or_bundled_tokenizer(folder):
    forbidden = ("pbkv.cli", "pbkv.predictor_commands", "pbkv.examples.tokenizer", "argparse")
    assert offenders(folder, forbidden) == {}


def test_the_checker_sees_relative_and_local_imports():
    sample = ROOT / "engines" / "torchengine" / "model.py"
    assert "pbkv.assets" in imported_modules(sample)  # imported inside a function
    assert any(
        m.startswith("pbkv.engines.torchengine")
        for m in imported_modules(ROOT / "engines" / "torchengine" / "__init__.py")
    )
