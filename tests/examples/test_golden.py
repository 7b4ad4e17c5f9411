"""The bundled apps' workloads are pinned: the graph ports reproduce the scripted
generators they replaced, token for token.

The digests were taken from the scripted generators (``RoutedApp.sample_path`` /
``build_steps``, commit aaed40c) before the apps became ``pbkv.live.App`` graphs; a
workload that differs in any step, token id, gap, tail, end reason, id or feature
changes its digest. Workflow ``i`` of ``seed`` depends only on ``(seed, i)``, so single
workflows far into a workload are pinned on their own.
"""

import hashlib
import json

import pytest

from pbkv.examples import get_app
from pbkv.live import simulate_workflow
from pbkv.live.build import SIM_CONTEXT_TOKENS
from pbkv.live.chat import smollm2_chat
from pbkv.predictor.trace import END

GOLDEN = {
    ("codegen", 0, 24): "ace9471b6b3b3c4d",
    ("codegen", 7, 24): "17ce49382c2881b7",
    ("hover", 0, 24): "304d05651e6630ee",
    ("hover", 7, 24): "27a028395e281f66",
    ("swebench", 0, 24): "a3980c51ce4c658e",
    ("swebench", 7, 24): "b6a7750a93e2338a",
    ("financebench", 0, 24): "a4a19beca1a7e937",
    ("financebench", 7, 24): "747d704c8141c122",
    ("taubench", 0, 24): "fd0ce6151e20f535",
}
PICKED = {  # (app, seed, first, last + 1): workflows first..last of the scripted workload
    ("hover", 0, 203, 204): "897e33b9a3eab492",  # re-plans until the cap
    ("taubench", 3, 196, 210): "1b6aee65b9f4b19d",  # 200..209 replay episodes again
}

EDGES = {  # the call graphs of the scripted apps
    "codegen": {
        ("planner", "coder"),
        ("coder", "tester"),
        ("tester", "analyzer"),
        ("tester", END),
        ("analyzer", "coder"),
    },
    "hover": {
        ("decomposer", "retriever"),
        ("retriever", "reader"),
        ("reader", "query_rewriter"),
        ("reader", "verifier"),
        ("query_rewriter", "retriever"),
        ("verifier", END),
        ("verifier", "decomposer"),
    },
    "swebench": {
        *(("manager", w) for w in ("localizer", "coder", "tester", "reviewer")),
        *((w, "manager") for w in ("localizer", "coder", "tester", "reviewer")),
        ("tester", END),
        ("reviewer", END),
    },
    "financebench": {
        ("researcher", "analyst"),
        ("analyst", "calculator"),
        ("calculator", "writer"),
        ("writer", "reviewer"),
        ("reviewer", END),
    },
    "taubench": {
        ("agent", "agent"),
        ("agent", "user"),
        ("agent", END),
        ("user", "agent"),
        ("user", END),
    },
}


def digest(workflows) -> str:
    """Return a short sha256 of everything a workload holds."""
    h = hashlib.sha256()
    for w in workflows:
        head = [
            w.workflow_id,
            w.app,
            w.task_id,
            w.task_text,
            sorted(w.task_features.items()),
            w.end_reason,
            w.tenant,
            w.arrival_s,
        ]
        h.update(json.dumps(head).encode())
        for s in w.steps:
            segments = [(g.kind, list(g.token_ids)) for g in s.segments]
            row = [s.agent, segments, list(s.output_token_ids), s.gap_s, s.context_tail]
            h.update(json.dumps(row).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize(("name", "seed", "n"), sorted(GOLDEN))
def test_workload_matches_the_scripted_generator(name, seed, n):
    assert digest(get_app(name).generate(n, seed)) == GOLDEN[name, seed, n]


@pytest.mark.parametrize(("name", "seed", "first", "stop"), sorted(PICKED))
def test_picked_workflows_match_the_scripted_generator(name, seed, first, stop):
    app, chat = get_app(name), smollm2_chat(SIM_CONTEXT_TOKENS)
    workflows = [
        simulate_workflow(app, app.task(seed, i), chat, workflow_id=f"{name}-{seed}-{i}", seed=seed)
        for i in range(first, stop)
    ]
    assert digest(workflows) == PICKED[name, seed, first, stop]


@pytest.mark.parametrize("name", sorted(EDGES))
def test_call_graph_is_the_scripted_one(name):
    assert set(get_app(name).edges) == EDGES[name]
