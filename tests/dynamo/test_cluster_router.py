"""pbkv's placement service in front of two pbkv workers (integrations/dynamo/router.py),
on 127.0.0.1 behind Dynamo's frontend."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from pbkv.cluster import ClusterSpec, start_cluster
from tests.dynamo.stack import conversation, run_turns, settled

pytestmark = pytest.mark.dynamo_stack

WORKFLOWS = [f"rw-{i}" for i in range(4)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec(replicas=2, router="pbkv", workdir=str(tmp_path_factory.mktemp("r")))
    with start_cluster(spec, timeout_s=120) as running:
        yield running


def test_the_placement_service_keeps_each_workflow_on_one_replica_and_passes_the_agent(cluster):
    with ThreadPoolExecutor(len(WORKFLOWS)) as pool:
        list(
            pool.map(
                lambda w: run_turns(cluster, w, 3, conversation(w), final_last=True), WORKFLOWS
            )
        )
    stats = settled(cluster, lambda s: not s["workflows_active"])
    served = [set(s["agents_by_workflow"]) for s in stats.values()]
    assert sorted(w for ws in served for w in ws) == WORKFLOWS  # none on two replicas
    assert all(a == ["planner"] for s in stats.values() for a in s["agents_by_workflow"].values())
    assert sum(s["ended"].get("end", 0) for s in stats.values()) == len(WORKFLOWS)
    hits = sum(s["cached_gpu_tokens"] for s in stats.values())
    prompts = sum(s["prompt_tokens"] for s in stats.values())
    assert hits > prompts / 3  # the later turns reuse the earlier ones' context
