"""``import pbkv`` works from a built wheel, outside the checkout (§2)."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_imports_outside_checkout(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = (tmp_path / "dist").glob("pbkv-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pbkv/kvmanager/radix.py" in names
    assert "pbkv/server/app.py" in names and "pbkv/integrations/langchain.py" in names
    assert "pbkv/cli/__init__.py" in names and "pbkv/cli/__main__.py" in names
    assert "pbkv/engines/sim/profiles/a6000-tp2.toml" in names
    for trace in ("taubench/gpt-4o-airline.json.gz", "mooncake/conversation_trace.jsonl.gz"):
        assert f"pbkv/data/{trace}" in names
        assert f"pbkv/data/{trace.split('/')[0]}/LICENSE" in names
    assert not any(n.startswith(("runtime/", "kvmanager/", "tests/")) for n in names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import pbkv, pbkv.kvmanager, pbkv.actors.serve, pbkv.engines.sim.profile as p;"
        "print(pbkv.__file__); print(p.load_hardware('a6000-tp2').name);"
        "from pbkv.examples import find_data_dir, load_mooncake;"
        "print(find_data_dir()); print(len(load_mooncake('synthetic')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": ""},  # no PBKV_DATA_DIR: the bundled traces
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert out[0].startswith(str(site))
    assert out[1] == "a6000-tp2"
    assert out[2] == str(site / "pbkv" / "data")
    assert out[3] == "3993"
