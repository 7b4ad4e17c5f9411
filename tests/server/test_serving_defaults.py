"""``pbkv serve --policy pbkv`` runs the measured pbkv (issue 26): the ``workflow``
scheduler and the online predictor, whose accuracy rises as workflows end. A real
``pbkv serve`` process on 127.0.0.1, driven by the real openai client."""

import re
import signal
import time

import httpx
import openai

from tests.server.conftest import serve_process

AGENTS = ("planner", "coder", "tester")


def _stats(base: str) -> dict:
    return httpx.get(f"{base}/stats", timeout=30).json()


def _learned(base: str, n: int) -> dict:
    """Wait (bounded) until the predictor has learned from ``n`` ended workflows."""
    deadline = time.monotonic() + 30
    while True:
        serving = _stats(base)["serving"]
        if serving["predictor_workflows_learned"] >= n or time.monotonic() > deadline:
            return serving
        time.sleep(0.05)


def test_pbkv_serve_defaults_are_the_workflow_scheduler_and_a_learning_predictor():
    with serve_process("--policy", "pbkv") as server:
        assert "scheduler workflow, predictor online" in server.banner
        base = server.url
        serving = _stats(base)["serving"]
        assert (serving["policy"], serving["scheduler"], serving["predictor"]) == (
            "pbkv",
            "workflow",
            "online",
        )
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=30)
        model = client.models.list().data[0].id
        accuracy = []
        for w in range(12):
            messages = [{"role": "user", "content": f"task {w}: fix the bug"}]
            for i, agent in enumerate(AGENTS):
                headers = {"X-PBKV-Workflow-Id": f"wf-{w}", "X-PBKV-Agent": agent}
                if i == len(AGENTS) - 1:
                    headers["X-PBKV-Final"] = "true"
                reply = client.chat.completions.create(
                    model=model, messages=messages, max_tokens=2, extra_headers=headers
                )
                messages += [
                    {"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": "next"},
                ]
            accuracy.append(_learned(base, w + 1))
        metrics = httpx.get(f"{base}/metrics", timeout=30).text
        server.proc.send_signal(signal.SIGINT)
        out = server.stopped()
    assert server.proc.returncode == 0, out
    assert accuracy[-1]["predictor_workflows_learned"] == 12
    first, last = accuracy[0]["predictor_top1"][0], accuracy[-1]["predictor_top1"][0]
    assert first < 0.5 < last  # scored before learning: it starts knowing nothing
    assert accuracy[-1]["predictor_recent_top1"][0] > 0.9
    assert 'pbkv_serving_info{policy="pbkv",scheduler="workflow",predictor="online"} 1' in metrics
    top1 = re.search(r'^pbkv_predictor_top1\{k="1"\} (\S+)$', metrics, re.M)
    assert top1 and float(top1.group(1)) == last
