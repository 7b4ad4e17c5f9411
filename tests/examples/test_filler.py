import random

import numpy as np

from pbkv.examples import decode
from pbkv.examples.filler import fill_lines, fill_template, from_pools


def test_fill_template_fills_each_slot_and_ends_the_line():
    ids = fill_template("def {name}({arg}):", {"name": "evict", "arg": "node"})
    assert decode(ids) == "def evict(node):\n"


def test_pool_values_are_drawn_on_first_use_and_kept_for_the_line():
    values = from_pools({"x": ("a", "b", "c", "d"), "y": ("e",)})(random.Random(3))
    first = values["x"]
    assert values["x"] == first and values["y"] == "e"
    assert decode(fill_template("{x} and {x}", values)) == f"{first} and {first}\n"


def test_fill_lines_gives_exactly_n_tokens_from_header_to_closing():
    pools = from_pools({"n": ("1", "22", "333")})
    ids = fill_lines("Result:\n", ("n = {n}",), 40, np.random.default_rng(0), pools, "<|im_end|>\n")
    text = decode(ids)
    assert len(ids) == 40
    assert text.startswith("Result:\nn = ") and text.endswith("<|im_end|>\n")


def test_fill_lines_keeps_a_long_header_whole():
    ids = fill_lines("a long header line", ("x",), 2, np.random.default_rng(0), from_pools({}))
    assert decode(ids) == "a long header line"


def test_fill_lines_draws_one_seed_from_the_stream():
    rng, twin = np.random.default_rng(5), np.random.default_rng(5)
    first = fill_lines("", ("{n}",), 30, rng, from_pools({"n": ("1", "2")}))
    twin.integers(2**63)
    assert rng.random() == twin.random()
    assert first == fill_lines(
        "", ("{n}",), 30, np.random.default_rng(5), from_pools({"n": ("1", "2")})
    )
