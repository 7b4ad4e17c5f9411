"""scripts/gpu_env.py: wheels picked for the running Python, and pbkv linked as
pyproject's package-dir maps it, without pip or an index."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env():
    return runpy.run_path(str(ROOT / "scripts" / "gpu_env.py"))


def test_a_wheel_fits_by_its_compressed_tags(env):
    tags = {("cp312", "cp312", "manylinux_2_17_x86_64"), ("py3", "none", "any")}
    fits = env["wheel_fits"]
    assert fits("outcome-1.3.0-py2.py3-none-any.whl", tags)
    assert fits("msgspec-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", tags)
    assert not fits("msgspec-0.23.0-cp311-cp311-manylinux_2_17_x86_64.whl", tags)


def test_the_wheel_for_this_python_is_picked(env, tmp_path):
    v = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for name in (
        "msgspec-0.23.0-cp399-cp399-manylinux_2_17_x86_64.whl",
        f"msgspec-0.23.0-{v}-{v}-manylinux_2_17_x86_64.whl",
        f"msgspec-0.22.0-{v}-{v}-manylinux_2_17_x86_64.whl",
    ):
        (tmp_path / name).touch()
    tags = {(v, v, "manylinux_2_17_x86_64")}
    picked = env["pick_wheel"](tmp_path, "msgspec", "0.23.0", tags)
    assert picked.name == f"msgspec-0.23.0-{v}-{v}-manylinux_2_17_x86_64.whl"
    assert env["pick_wheel"](tmp_path, "msgspec", "0.24.0", tags) is None


def test_installed_distributions_are_left_alone_and_a_missing_wheel_is_named(env, tmp_path):
    (tmp_path / "requirements.txt").write_text("trio==0.0.1\nnot-a-real-dist==1.0\n")
    with pytest.raises(SystemExit, match="not-a-real-dist==1.0"):
        env["unpack_missing"](tmp_path, tmp_path / "site")  # trio is here: skipped


def test_pbkv_links_import_without_installing(env, tmp_path):
    env["link_pbkv"](tmp_path)
    code = "import pbkv, pbkv.engines.trtllm.blockkey as b; print(pbkv.__file__, b.__file__)"
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); {code}"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.split()
    assert out[0] == str(tmp_path / "pbkv" / "__init__.py")
    assert out[1] == str(tmp_path / "pbkv" / "engines" / "trtllm" / "blockkey.py")
