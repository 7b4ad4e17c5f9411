"""NATS, Dynamo's frontend and two pbkv workers on 127.0.0.1 (pbkv/cluster.py,
integrations/dynamo/worker.py), driven over HTTP as a client would.

The sim engine runs in real time (~60 ms a decode step), so each call of 8 tokens takes
about half a second. One cluster serves the module; the tests run in file order, the
worker kill last.
"""

import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

from pbkv.cluster import ClusterSpec, start_cluster
from tests.dynamo.stack import chat, conversation, run_turns, settled, stats_by_worker, trace

pytestmark = pytest.mark.dynamo_stack

WORKFLOWS = [f"wf-{i}" for i in range(5)]
TURNS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec(replicas=2, router="kv-affinity", workdir=str(tmp_path_factory.mktemp("c")))
    with start_cluster(spec, timeout_s=120) as running:
        yield running


HISTORIES = {}


def test_every_turn_of_a_workflow_lands_on_one_replica_and_router_hits_equal_pbkvs(cluster):
    with ThreadPoolExecutor(len(WORKFLOWS)) as pool:
        done = pool.map(
            lambda w: run_turns(cluster, w, TURNS, conversation(w), settle_s=0.5), WORKFLOWS
        )
        HISTORIES.update(zip(WORKFLOWS, done, strict=True))
    records = trace(cluster, len(WORKFLOWS) * TURNS)
    assert len(records) == len(WORKFLOWS) * TURNS
    replicas = defaultdict(set)
    router_cached = defaultdict(int)
    for r in records:
        worker = r["request"]["worker"]["decode_worker_id"]
        replicas[r["agent_context"]["session_id"]].add(worker)
        router_cached[worker] += r["request"]["cached_tokens"]
    assert {w: len(s) for w, s in replicas.items()} == dict.fromkeys(WORKFLOWS, 1)
    stats = stats_by_worker(cluster)
    pbkv_cached = {w: s["cached_gpu_tokens"] + s["cached_host_tokens"] for w, s in stats.items()}
    assert {w: router_cached[w] for w in pbkv_cached} == pbkv_cached
    assert sum(pbkv_cached.values()) > 0
    assert sum(router_cached.values()) == sum(pbkv_cached.values())


def test_session_final_retires_the_workflows_cache(cluster):
    before = stats_by_worker(cluster)
    assert sorted(w for s in before.values() for w in s["workflows_active"]) == WORKFLOWS
    assert all(s["retired_blocks"] == 0 for s in before.values())
    with ThreadPoolExecutor(len(WORKFLOWS)) as pool:
        list(pool.map(lambda w: run_turns(cluster, w, 1, HISTORIES[w], final_last=True), WORKFLOWS))
    after = settled(cluster, lambda s: s["retired_blocks"] == s["cached_blocks"])
    assert all(s["workflows_active"] == [] for s in after.values())
    assert sum(s["ended"].get("end", 0) for s in after.values()) == len(WORKFLOWS)
    for s in after.values():  # nothing else is cached there: every block is retired
        assert s["retired_blocks"] == s["cached_blocks"]
    assert sum(s["retired_blocks"] for s in after.values()) > 0


def test_a_killed_worker_fails_its_requests_and_the_others_go_on(cluster):
    results = {}

    def long_call(workflow):
        try:
            results[workflow] = chat(cluster, workflow, conversation(workflow), max_tokens=300)
        except (urllib.error.URLError, OSError) as exc:
            results[workflow] = exc

    calls = [threading.Thread(target=long_call, args=(w,)) for w in ("long-a", "long-b")]
    for t in calls:
        t.start()
    victim = None
    deadline = time.monotonic() + 20
    while victim is None and time.monotonic() < deadline:
        for i in range(cluster.spec.replicas):
            if cluster.worker_stats(i).get("serving"):
                victim = i
                break
        time.sleep(0.05)
    assert victim is not None, "no worker reported a call in flight"
    doomed = set(cluster.worker_stats(victim)["serving"])
    os.kill(cluster.workers[victim].pid, signal.SIGKILL)
    cluster.workers[victim].wait(timeout=10)
    for t in calls:
        t.join(timeout=60)
    for workflow in doomed:
        assert isinstance(results[workflow], urllib.error.HTTPError | OSError), results[workflow]
    # new workflows are served by the replica left
    survivor = 1 - victim
    served_before = len(trace(cluster, 0))
    for w in ("after-a", "after-b"):
        out = run_turns(cluster, w, 2, conversation(w))
        assert out[-2]["role"] == "assistant"
    records = trace(cluster, served_before + 4)[served_before:]
    survivor_id = cluster.worker_stats(survivor)["worker_id"]
    assert [r["request"]["worker"]["decode_worker_id"] for r in records[-4:]] == [survivor_id] * 4
