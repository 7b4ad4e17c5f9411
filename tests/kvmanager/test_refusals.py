"""Refusals decided from the queue's index (``KVManager._refused_as_is``, ``refusals``)
and the tree's version: a request refused without trying is one the full path of
``try_admit`` would refuse too, leaving the cache exactly as it was."""

import random

import numpy as np
import pytest

from pbkv.kvmanager import AdmitRequest, KVManager

from .conftest import make_manager


def snapshot(mgr: KVManager) -> tuple:
    """What an admission could observe: every node's span, copies and locks, the pools,
    the leased counts and each tier's eviction order (policy key, then serial)."""
    tree = mgr.tree
    nodes = sorted(
        (n.serial, tuple(n.keys), n.parent.serial, n.gpu_blocks is not None,
         n.host_blocks is not None, n.lock_count, n.loading)
        for n in tree.nodes()
    )  # fmt: skip
    order = {}
    for tier, candidate in (("gpu", tree._gpu_candidate), ("host", tree._host_candidate)):
        keyed = [(mgr.policy.priority(n), n.serial) for n in tree.nodes() if candidate(n)]
        order[tier] = [serial for _, serial in sorted(keyed)]
    return (
        nodes,
        tree.gpu.num_free,
        tree.host.num_free,
        tree.leased_blocks("gpu"),
        tree.leased_blocks("host"),
        order,
    )


def random_state(seed: int, policy: str) -> tuple[KVManager, list[AdmitRequest], list]:
    """A small contested cache: shared prefixes, running requests holding leases, some
    host-only and loading nodes, a retired workflow; and a queue indexed over it."""
    rng = random.Random(seed)
    clock = iter(range(1, 10_000))
    mgr = make_manager(lambda: next(clock), policy, gpu=rng.randint(12, 24), host=16)
    workflows = [f"w{i}" for i in range(4)]
    for w in workflows:
        mgr.on_workflow_started(w)
    forecast = np.full((3, 3), 1 / 3)
    running = []

    def prompt() -> list[int]:
        stem = rng.choice([[1, 2, 3], [1, 2, 4, 5], [7, 8], [1, 9]])
        return stem + [rng.randint(10, 40) for _ in range(rng.randint(0, 4))]

    for _ in range(rng.randint(4, 10)):
        keys, w = prompt(), rng.choice(workflows)
        adm = mgr.try_admit(AdmitRequest(keys, len(keys), rng.randint(1, 3), w, "a"))
        if adm is None:
            continue
        for load in adm.loads:
            mgr.complete_load(load, ok=rng.random() < 0.9)
        try:
            mgr.commit(adm, keys)
        except ValueError:
            mgr.release(adm)
            continue
        if rng.random() < 0.5:
            running.append(adm)  # keeps its lease and reservation
        else:
            mgr.release(adm)
        mgr.on_forecast(w, forecast, ["a", "b"])
    if rng.random() < 0.5:
        mgr.on_workflow_terminated(workflows[0])
    if rng.random() < 0.5:
        mgr.tree.evict("gpu", rng.randint(1, 4))  # some host-only nodes
    queue = [
        AdmitRequest(k := prompt(), len(k) + rng.randint(0, 1), rng.randint(1, 8), "w1", "a")
        for _ in range(6)
    ]
    mgr.note_waiting(queue)
    return mgr, queue, running


@pytest.mark.parametrize("policy", ["lru", "pbkv"])
def test_a_refusal_without_trying_is_a_refusal_that_changes_nothing(policy, monkeypatch):
    decided = 0
    for seed in range(60):
        mgr, queue, _ = random_state(seed, policy)
        for request in queue:
            total = mgr.blocks_needed(request.prompt_tokens, request.max_new_tokens)
            if total > mgr.config.gpu_capacity_blocks:
                continue
            for retired_only in (False, True):
                if not mgr._refused_as_is(request, total, retired_only):
                    continue
                decided += 1
                before = snapshot(mgr)
                with monkeypatch.context() as m:  # the full path: match, lease, evict
                    m.setattr(KVManager, "_refused_as_is", lambda *a: False)
                    assert mgr.try_admit(request, retired_only=retired_only) is None
                assert snapshot(mgr) == before, f"seed {seed}: the full path changed the cache"
        mgr.check_integrity()
    assert decided > 50  # the states do exercise it


@pytest.mark.parametrize("policy", ["lru", "pbkv"])
def test_refusals_names_exactly_the_requests_refused_one_by_one(policy):
    for seed in range(60):
        mgr, queue, _ = random_state(seed, policy)
        for retired_only in (False, True):
            one_by_one = set()
            for request in queue:
                total = mgr.blocks_needed(request.prompt_tokens, request.max_new_tokens)
                fits_tier = total <= mgr.config.gpu_capacity_blocks
                if fits_tier and mgr._refused_as_is(request, total, retired_only):
                    one_by_one.add(id(request.keys))
            assert mgr.refusals(queue, retired_only=retired_only) == one_by_one, seed
            assert mgr.refusals(queue, retired_only=retired_only) == one_by_one  # kept


def test_a_refused_request_admits_once_room_frees_and_counts_every_refusal(clock):
    mgr = make_manager(clock, "lru", gpu=6, host=0)
    running = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 1))  # leases 4 of 6 blocks
    waiting = AdmitRequest([7, 8, 9], 3, 1)  # needs 4
    mgr.note_waiting([waiting])
    assert mgr.refusals([waiting]) == {id(waiting.keys)}
    assert mgr.try_admit(waiting) is None
    assert mgr.statistics().rejected_admissions == 1
    mgr.count_refusals(2)  # a scheduler that knows two more tries would be refused
    assert mgr.statistics().rejected_admissions == 3
    mgr.commit(running, [1, 2, 3])
    mgr.release(running)  # [1, 2, 3] cached, unleased: evictable now
    assert mgr.refusals([waiting]) == set()
    assert mgr.try_admit(waiting) is not None
    mgr.check_integrity()


def test_the_tree_version_moves_with_every_change_and_only_then(clock):
    mgr = make_manager(clock, "lru", gpu=8, host=8)
    tree = mgr.tree
    seen = [tree.version]

    def changed() -> bool:
        seen.append(tree.version)
        return seen[-1] != seen[-2]

    adm = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 1))
    assert changed()
    tree.peek_prefix([1, 2, 3])
    tree.peek_spans([1, 2])
    tree.match_prefix([5])  # nothing cached: no split
    assert not changed()
    mgr.commit(adm, [1, 2, 3])
    assert changed()
    mgr.release(adm)
    assert changed()
    tree.match_prefix([1, 2, 9])  # splits [1, 2, 3]
    assert changed()
    tree.evict("gpu", 1)
    assert changed()
    node = tree.match_prefix([1, 2]).path[-1]
    tree.reprioritize(node)
    assert changed()
    load = tree.begin_load([n for n in tree.match_prefix([1, 2, 3]).path if not n.on_gpu])
    assert changed()
    tree.complete_load(load, ok=True)
    assert changed()
    tree.lowest_candidate("gpu")
    assert not changed()


def test_a_lowest_candidate_on_the_requests_own_prefix_is_left_to_the_full_path(clock):
    """The lease skips the request's own prefix, so the retired node behind it is evicted
    and the retired-only admission succeeds: it must not be refused without trying."""
    mgr = make_manager(clock, "lru", gpu=6, host=0)
    for workflow, keys in (("wa", [1, 2]), ("wb", [7, 8])):
        mgr.on_workflow_started(workflow)
        clock.advance()
        adm = mgr.try_admit(AdmitRequest(keys, 2, 1, workflow, "a"))
        mgr.commit(adm, keys)
        mgr.release(adm)
    mgr.on_workflow_terminated("wb")  # [7, 8] retired; [1, 2] is the least recent
    request = AdmitRequest([1, 2, 3], 3, 2, "wa", "a")  # 5 blocks, 2 cached: 1 short
    mgr.note_waiting([request])
    assert mgr.tree.lowest_candidate("gpu").keys == [1, 2]
    assert mgr.refusals([request], retired_only=True) == set()
    adm = mgr.try_admit(request, retired_only=True)
    assert adm is not None and adm.cached_gpu_tokens == 2
    mgr.check_integrity()


def one_by_one(mgr: KVManager, queue: list[AdmitRequest], retired_only: bool) -> set[int]:
    refused = set()
    for request in queue:
        total = mgr.blocks_needed(request.prompt_tokens, request.max_new_tokens)
        if total <= mgr.config.gpu_capacity_blocks and mgr._refused_as_is(
            request, total, retired_only
        ):
            refused.add(id(request.keys))
    return refused


@pytest.mark.parametrize("policy", ["lru", "pbkv"])
def test_kept_quick_refusals_follow_every_change_between_calls(policy):
    """refusals() keeps its quick tests across calls while the index, the free blocks
    and the lowest candidate stay; releases, evictions, leases and re-synced queues
    between calls leave it naming exactly the requests refused one by one."""
    kept = 0
    for seed in range(60):
        mgr, queue, running = random_state(seed, policy)
        rng = random.Random(seed)
        for _ in range(6):
            assert mgr.refusals(queue, retired_only=True) == one_by_one(mgr, queue, True), seed
            before = mgr._quick
            assert mgr.refusals(queue, retired_only=True) == one_by_one(mgr, queue, True), seed
            kept += before is not None and mgr._quick is before
            op = rng.random()
            if op < 0.3 and running:
                mgr.release(running.pop())  # free blocks and candidates change
            elif op < 0.5:
                mgr.tree.evict("gpu", 1)
            elif op < 0.6:
                lease = mgr.tree.lock(rng.choice(list(mgr.tree.nodes())))
                mgr.tree.unlock(lease)  # the version moves, nothing else
            elif op < 0.75:  # scores move: another lowest candidate, the same free blocks
                forecast = np.array([[rng.random(), rng.random(), 0.1]])
                mgr.on_forecast(f"w{rng.randint(0, 3)}", forecast / forecast.sum(), ["a", "b"])
            else:
                mgr.note_waiting(queue[rng.randint(0, 3) :])  # the index re-synced
                queue = queue[rng.randint(0, 2) :]
                mgr.note_waiting(queue)
        mgr.check_integrity()
    assert kept > 50  # the kept tests were reused


def decisions(mgr: KVManager, queue: list[AdmitRequest]) -> tuple:
    """Everything a quiet admission call reads of the manager for ``queue``: what
    ``refusals`` and ``_refused_as_is`` refuse as is (both modes), each request's
    in-flight hold, and the index's version."""
    return (
        mgr.refusals(queue, retired_only=True),
        one_by_one(mgr, queue, True),
        one_by_one(mgr, queue, False),
        [mgr.prefix_in_flight(r.keys, r.namespace) for r in queue],
        mgr.waiting.version,
    )


def prefilling(mgr: KVManager, rng: random.Random, queue: list[AdmitRequest]) -> list:
    """Admit a few long requests, some extending a queued prompt, each to be committed
    chunk by chunk: ``[admission, keys, blocks committed so far]``."""
    out = []
    for _ in range(3):
        stem = list(rng.choice(queue).keys) if rng.random() < 0.7 else [1, 2]
        keys = stem[: rng.randint(1, len(stem))] + [rng.randint(50, 90) for _ in range(3)]
        if len(keys) + 1 > mgr.config.gpu_capacity_blocks:
            continue
        adm = mgr.try_admit(AdmitRequest(keys, len(keys), 1, "w2", "a"))
        if adm is None or adm.loads:
            if adm is not None:
                mgr.release(adm)
            continue
        out.append([adm, keys, adm.committed_blocks])
    return out


@pytest.mark.parametrize("policy", ["lru", "pbkv"])
def test_a_settled_commit_changes_nothing_a_refusal_reads(policy):
    """Chunk commits below a request's own lease keep ``settled_version``; whenever it
    stays, every refusal, in-flight hold and the index answer as before the commit;
    commits that extend a queued walk or free a duplicate, and every other change, move
    it."""
    kept = moved = 0
    for seed in range(150):
        mgr, queue, _ = random_state(seed, policy)
        rng = random.Random(seed)
        chunks = prefilling(mgr, rng, queue)
        mgr.note_waiting(queue)
        for _ in range(12):
            left = [c for c in chunks if c[2] < len(c[1])]
            if not left:
                break
            chunk = rng.choice(left)
            adm, keys, done = chunk
            chunk[2] = done = min(len(keys), done + rng.randint(1, 3))
            version, before = mgr.settled_version(), decisions(mgr, queue)
            mgr.commit(adm, keys[:done])
            if mgr.settled_version() == version:
                kept += 1
                assert decisions(mgr, queue) == before, seed
            else:
                moved += 1
            mgr.note_waiting(queue)  # as each admission call begins
        for adm, _, _ in chunks:
            version = mgr.settled_version()
            mgr.release(adm)
            assert mgr.settled_version() != version  # free blocks and leases change
        mgr.check_integrity()
    assert kept > 100 and moved > 25, (kept, moved)  # both kinds of commit were met


def test_settled_version_moves_with_every_change_but_a_chunk_below_the_lease(clock):
    mgr = make_manager(clock, "lru", gpu=16, host=8)
    adm = mgr.try_admit(AdmitRequest([1, 2, 3, 4, 5, 6], 6, 1, None))
    version = mgr.settled_version()
    mgr.commit(adm, [1, 2])
    mgr.commit(adm, [1, 2, 3, 4])
    assert mgr.settled_version() == version  # two chunks, each a new leased leaf
    queued = AdmitRequest([1, 2, 3, 4, 5, 9], 6, 1, None)
    mgr.note_waiting([queued])
    assert mgr.settled_version() == version  # syncing the index re-keys nothing (lru)
    mgr.commit(adm, [1, 2, 3, 4, 5])
    assert mgr.settled_version() != version  # the chunk extends the queued walk
    twin = mgr.try_admit(AdmitRequest([1, 2, 3, 4, 5, 6, 7], 7, 1, None))
    version = mgr.settled_version()
    mgr.commit(adm, [1, 2, 3, 4, 5, 6])
    mgr.commit(twin, [1, 2, 3, 4, 5, 6])  # a duplicate block: freed, not a new leaf
    assert mgr.settled_version() != version
    version = mgr.settled_version()
    mgr.tree.reprioritize(adm.lease.node)  # any other change
    assert mgr.settled_version() != version
