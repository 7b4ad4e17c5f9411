"""Helpers of the Dynamo stack tests: a client of the cluster's frontend and readers of
the frontend's request trace and the workers' counters."""

import json
import time
import urllib.request


def chat(cluster, workflow, messages, *, agent="planner", final=False, max_tokens=8, timeout=60):
    headers = {
        "Content-Type": "application/json",
        "X-Dynamo-Session-ID": workflow,
        "x-dynamo-meta-agent": agent,
    }
    if final:
        headers["X-Dynamo-Session-Final"] = "true"
    body = {"model": cluster.spec.model_name, "messages": messages, "max_tokens": max_tokens}
    request = urllib.request.Request(
        f"{cluster.url}/v1/chat/completions", json.dumps(body).encode(), headers
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def conversation(workflow):
    # the workflow's name leads, so no two workflows share a block: the router's overlap
    # and pbkv's hits are then equal by construction, not by the timing of events
    system = f"{workflow}: you are its planner. " + "Plan each step with care. " * 30
    return [{"role": "system", "content": system}, {"role": "user", "content": "begin"}]


def run_turns(cluster, workflow, turns, messages, *, final_last=False, settle_s=0.0):
    """Run ``turns`` turns of ``workflow``; ``settle_s`` waits between turns so the
    previous turn's KV events reach the router before the next turn is routed (events
    travel asynchronously: sent at once, a turn can be routed on a view one block short)."""
    for turn in range(turns):
        final = final_last and turn == turns - 1
        out = chat(cluster, workflow, messages, final=final)
        messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
        messages.append({"role": "user", "content": f"go on ({turn})"})
        if settle_s and turn < turns - 1:
            time.sleep(settle_s)
    return messages


def trace(cluster, count, timeout_s=15.0):
    """Return the frontend's request records once ``count`` are written."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = [r for r in cluster.trace_records() if r.get("event_type") == "request_end"]
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def stats_by_worker(cluster):
    out = {}
    for i in range(cluster.spec.replicas):
        s = cluster.worker_stats(i)
        if s:
            out[s["worker_id"]] = s
    return out


def settled(cluster, check, timeout_s=10.0):
    """Return the workers' counters once ``check`` holds for each (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = stats_by_worker(cluster)
        if all(check(s) for s in stats.values()) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)
