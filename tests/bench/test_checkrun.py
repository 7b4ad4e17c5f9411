"""pbkv.bench.checkrun: a report written after every section; a carried tokenizer file."""

from __future__ import annotations

import json

import pbkv.assets
from pbkv.bench.checkrun import SectionReport, use_tokenizer_file


def test_the_report_is_on_disk_after_each_section_and_errors_are_kept(tmp_path):
    path = tmp_path / "out" / "report.json"
    report = SectionReport(path, {"device": "cpu"})
    assert json.loads(path.read_text()) == {"device": "cpu"}
    assert report.run("first", lambda: {"tokens_per_s": 1.5})
    seen = {}

    def second():
        seen.update(json.loads(path.read_text()))  # what a cut run would leave
        raise RuntimeError("no CUDA")

    assert not report.run("second", second)
    assert seen["first"] == {"tokens_per_s": 1.5}
    data = json.loads(path.read_text())
    assert data["second"] == {"error": "RuntimeError: no CUDA"}
    assert set(data["seconds"]) == {"first", "second"}
    assert report.failed == ["second"] and not report.ok


def test_a_tokenizer_file_stands_in_for_the_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(pbkv.assets, "load_tokenizer", pbkv.assets.load_tokenizer)
    expected = pbkv.assets.encode("def add(a, b):")
    pbkv.assets.load_tokenizer().save(str(tmp_path / "tokenizer.json"))
    use_tokenizer_file(tmp_path / "tokenizer.json")
    assert pbkv.assets.load_tokenizer() is not None
    assert pbkv.assets.encode("def add(a, b):") == expected
