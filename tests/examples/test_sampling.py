import numpy as np

from pbkv.examples.sampling import draw_gap_s, draw_tokens, noisy_tier, spawn_rngs


class FixedNoise:
    """Stands in for a numpy generator whose normal draws are all ``value``."""

    def __init__(self, value):
        self.value = value

    def normal(self, loc, scale):
        return self.value


def test_stream_k_does_not_depend_on_how_many_are_spawned():
    assert spawn_rngs(1, 2, 2)[1].random() == spawn_rngs(1, 2, 3)[1].random()
    assert spawn_rngs(1, 2, 1)[0].random() != spawn_rngs(1, 3, 1)[0].random()


def test_draw_tokens_includes_both_bounds_and_truncates_the_bonus():
    rng = np.random.default_rng(0)
    assert draw_tokens(rng, (5, 5), bonus=2.9) == 7
    assert {draw_tokens(rng, (1, 2)) for _ in range(50)} == {1, 2}


def test_draw_gap_s_rounds_to_milliseconds():
    rng = np.random.default_rng(0)
    assert draw_gap_s(rng, (0.0, 0.0)) == 0.0
    gap_s = draw_gap_s(rng, (1.0, 2.0))
    assert 1.0 <= gap_s <= 2.0 and round(gap_s, 3) == gap_s


def test_noisy_tier_cuts_at_0_35_and_0_7():
    tiers = [noisy_tier(FixedNoise(0.0), d) for d in (0.34, 0.35, 0.69, 0.7)]
    assert tiers == [0, 1, 1, 2]
    assert noisy_tier(FixedNoise(0.4), 0.0) == 1
