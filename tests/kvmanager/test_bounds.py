"""Offline bounds: the infinite-cache ceiling and exact MIN over a recorded order (§9)."""

import functools
import random

import pytest

from pbkv.kvmanager import AccessLog, KVConfig, KVManager, ceiling_hits, min_hits
from pbkv.kvmanager.manager import AdmitRequest


def log_of(events, block_size=1):
    log = AccessLog(block_size)
    for kind, keys in events:
        if kind == "a":
            log.access(keys, "", len(keys) * block_size)
        else:
            log.insert(keys, "", 0)
    return log


def brute_force_min(events, capacity):
    """Most hits over every keep/bypass/evict choice (single-key events only)."""
    flat = [(kind == "a", keys[0]) for kind, keys in events]

    @functools.cache
    def best(i, resident):
        if i == len(flat):
            return 0
        is_access, k = flat[i]
        hit = int(is_access and k in resident)
        options = [resident]  # bypass (or keep, when resident)
        if k not in resident:
            if len(resident) < capacity:
                options.append(resident | {k})
            else:
                options.extend((resident - {v}) | {k} for v in resident)
        return hit + max(best(i + 1, s) for s in options)

    return best(0, frozenset())


def test_min_on_a_hand_trace():
    # capacity 2: A B C A B — MIN keeps A and B (C bypassed): 2 hits; LRU would get 0
    log = log_of([("a", [1]), ("a", [2]), ("a", [3]), ("a", [1]), ("a", [2])])
    assert min_hits(log, 2) == 2
    assert min_hits(log, 1) == 1
    assert min_hits(log, 0) == 0
    assert ceiling_hits(log) == 2


def test_a_decoded_key_can_hit_on_its_first_access():
    log = log_of([("i", [7]), ("a", [7])])
    assert min_hits(log, 1) == 1 == ceiling_hits(log)


@pytest.mark.parametrize("seed", range(60))
def test_min_equals_exhaustive_search(seed):
    rng = random.Random(seed)
    events = [(rng.choice("aai"), [rng.randrange(5)]) for _ in range(11)]
    capacity = rng.randrange(1, 4)
    assert min_hits(log_of(events), capacity) == brute_force_min(events, capacity)


def test_ceiling_counts_decoded_keys_as_available_and_ignores_order():
    log = AccessLog(block_size=4)
    log.access([1, 2], "", 9)  # 2 full blocks + 1 token: both keys miss
    log.insert([1, 2, 3], "", 2)  # key 3 was decoded
    log.access([1, 2, 3], "", 12)
    log.access([3], "t1", 4)  # another tenant: a different key
    assert ceiling_hits(log) == 3
    assert log.hit_rate(ceiling_hits(log)) == pytest.approx(3 * 4 / 25)
    assert min_hits(log, 10) == 3  # this order reaches it
    # the same requests in another order: same ceiling, which that order cannot reach
    other = AccessLog(block_size=4)
    other.access([3], "t1", 4)
    other.access([1, 2, 3], "", 12)
    other.insert([1, 2, 3], "", 3)
    other.access([1, 2], "", 9)
    other.insert([1, 2, 3], "", 2)
    assert ceiling_hits(other) == 3
    assert min_hits(other, 10) == 2


def test_min_rejects_negative_capacity():
    with pytest.raises(ValueError, match="capacity_blocks"):
        min_hits(AccessLog(1), -1)


def test_manager_records_accesses_and_commits():
    log = AccessLog(block_size=2)
    kv = KVManager(
        KVConfig(block_size=2, gpu_capacity_blocks=16, host_capacity_blocks=0, policy="lru"),
        lambda: 0.0,
        access_log=log,
    )
    a = kv.try_admit(AdmitRequest(keys=[1, 2], prompt_tokens=5, max_new_tokens=3))
    kv.commit(a, [1, 2])
    kv.commit(a, [1, 2, 3, 4])
    kv.release(a)
    b = kv.try_admit(AdmitRequest(keys=[1, 2, 3], prompt_tokens=6, max_new_tokens=1))
    # the first commit's keys were not accessed again before the second re-offered them
    assert log.events == [(True, (0, 1)), (False, ()), (False, (0, 1, 2, 3)), (True, (0, 1, 2))]
    assert log.produced == {2, 3}
    assert log.prompt_tokens == 11
    assert b.cached_gpu_tokens == 6 == 2 * ceiling_hits(log)


def chained(values):
    """Return keys that chain every earlier value, as :func:`block_keys`' do: equal keys
    at a position mean equal prefixes (the log's extensions rely on it)."""
    keys, key = [], 0
    for v in values:
        key = hash((key, v))
        keys.append(key)
    return keys


@pytest.mark.parametrize("seed", range(6))
def test_chunk_commits_logged_as_extensions_give_the_bounds_of_whole_commits(seed):
    # requests commit their prompts chunk by chunk while others access the same keys;
    # the extending log drops re-offered keys, the whole log keeps every commit
    rng = random.Random(seed)
    short, whole = AccessLog(1), AccessLog(1)
    running: dict[int, tuple[list[int], int, object]] = {}
    prefixes = [chained([rng.randrange(3) for _ in range(12)]) for _ in range(4)]
    for step in range(300):
        if rng.random() < 0.3 or not running:
            keys = prefixes[rng.randrange(4)][: rng.randrange(2, 12)] + [100 + step]
            for log in (short, whole):
                log.access(keys, "ns" if step % 7 == 0 else "", len(keys))
            running[step] = (keys, 0, None)
            continue
        rid = rng.choice(list(running))
        keys, done, logged = running[rid]
        upto = min(len(keys) + 3, done + rng.randrange(1, 4))  # past the prompt: decoded
        ns = "ns" if rid % 7 == 0 else ""
        extended = keys + [1000 + rid * 10 + i for i in range(3)]
        logged = short.insert_extending(logged, extended[:upto], ns, len(keys))
        whole.insert(extended[:upto], ns, len(keys))
        if upto >= len(keys) + 3:
            del running[rid]
        else:
            running[rid] = (keys, upto, logged)
    assert short.produced == whole.produced
    assert ceiling_hits(short) == ceiling_hits(whole)
    dropped = sum(map(len, (k for _, k in whole.events))) - sum(
        map(len, (k for _, k in short.events))
    )
    assert dropped > 100  # the extending log is shorter
    for capacity in (0, 1, 3, 8, 20, 60, 200):
        assert min_hits(short, capacity) == min_hits(whole, capacity), capacity
