import gzip

import pytest

from pbkv.examples import BUNDLED_DATA_DIR, find_data_dir, find_data_file
from pbkv.examples.data import read_data_text


def test_bundled_traces_are_the_default_and_carry_their_licences(monkeypatch):
    monkeypatch.delenv("PBKV_DATA_DIR", raising=False)
    assert find_data_dir() == BUNDLED_DATA_DIR
    assert BUNDLED_DATA_DIR.name == "data"
    for folder, licence in (("taubench", "MIT License"), ("mooncake", "Apache License")):
        assert licence in (BUNDLED_DATA_DIR / folder / "LICENSE").read_text()
    path = find_data_file("taubench/gpt-4o-airline.json")
    assert path == BUNDLED_DATA_DIR / "taubench" / "gpt-4o-airline.json.gz"


def test_data_dir_is_explicit_then_from_environment(monkeypatch, tmp_path):
    with pytest.raises(FileNotFoundError, match="data_dir"):
        find_data_dir(tmp_path / "missing")
    monkeypatch.setenv("PBKV_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="PBKV_DATA_DIR"):
        find_data_dir()
    monkeypatch.setenv("PBKV_DATA_DIR", str(tmp_path))
    assert find_data_dir() == tmp_path.resolve()
    assert find_data_dir(BUNDLED_DATA_DIR) == BUNDLED_DATA_DIR


def test_plain_file_wins_over_its_gzip_copy(tmp_path):
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(b'"zipped"'))
    assert read_data_text(find_data_file("t.json", tmp_path)) == '"zipped"'
    (tmp_path / "t.json").write_text('"plain"')
    assert read_data_text(find_data_file("t.json", tmp_path)) == '"plain"'
    with pytest.raises(FileNotFoundError, match=r"u\.json not found \(nor u\.json\.gz"):
        find_data_file("u.json", tmp_path)


def test_broken_gzip_names_the_file(tmp_path):
    (tmp_path / "t.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"t\.json\.gz: not a valid gzip file"):
        read_data_text(find_data_file("t.json", tmp_path))
