"""Tests for server/sessions.py: client workflow ids mapped to live workflows.

A client's id must always open (or join) its own workflow: never another tenant's, and
never fail because the same id's previous workflow is still finishing a request.
"""

from __future__ import annotations

import re

import pbkv
from pbkv.server.errors import APIError
from pbkv.server.hints import Hints
from pbkv.server.sessions import SessionRegistry
from tests.server.conftest import Served


async def test_a_salted_id_and_an_unsalted_id_that_spell_alike_are_two_workflows():
    async with pbkv.open_runtime(engine="sim") as runtime:
        registry = SessionRegistry(runtime)
        salted, plain = Hints("x", "a", False, "A"), Hints("A/x", "a", False, "")
        async with registry.workflow(salted) as one, registry.workflow(plain) as two:
            assert (one.workflow_id, two.workflow_id) == ("x", "A/x")  # what clients sent
            assert one.workflow is not two.workflow
            assert len(set(runtime.active_workflows())) == 2
        await registry.close()
    records = [(r.workflow_id, r.tenant) for r in registry.records()]
    assert records == [("x", "A"), ("A/x", "")]
    assert len({r.live_id for r in registry.records()}) == 2


async def test_an_id_reused_after_final_opens_a_new_workflow_while_the_old_one_finishes():
    async with pbkv.open_runtime(engine="sim") as runtime:
        registry = SessionRegistry(runtime)
        async with registry.workflow(Hints("F", "slow", False, "")) as slow:  # in flight
            async with registry.workflow(Hints("F", "closer", True, "")) as closer:
                assert closer.workflow is slow.workflow
                await closer.settle()  # final: F ends once the slow request is done
            async with registry.workflow(Hints("F", "next", False, "")) as after:
                assert after.workflow is not slow.workflow and after.workflow_id == "F"
                await after.settle()
            await slow.settle()
        await registry.close()
    records = [(r.workflow_id, r.agents, r.state) for r in registry.records()]
    assert records == [("F", ["slow", "closer"], "final"), ("F", ["next"], "closed")]


async def test_the_workflow_header_echoes_the_id_the_client_sent(served: Served):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hi."}],
        "max_tokens": 2,
        "cache_salt": "A",
        "pbkv": {"workflow_id": "x"},
    }
    reply = await served.http("POST", "/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-pbkv-workflow-id"] == "x"


def _hints(workflow_id: str | None, tenant: str) -> Hints:
    return Hints(workflow_id, "a", False, tenant, tenant)


async def test_one_tenant_at_its_limit_ends_its_own_idle_workflows_never_anothers():
    async with pbkv.open_runtime(engine="sim") as runtime:
        registry = SessionRegistry(runtime, max_sessions=8, max_sessions_per_tenant=3)
        async with registry.workflow(_hints("b-1", "b")):
            pass
        for i in range(5):
            async with registry.workflow(_hints(f"a-{i}", "a")):
                pass
        open_ids = {wf.rsplit("/", 1)[-1] for wf in runtime.active_workflows()}
        async with (
            registry.workflow(_hints("a-busy-1", "a")) as one,
            registry.workflow(_hints("a-busy-2", "a")),
            registry.workflow(_hints("a-busy-3", "a")),
        ):
            try:
                async with registry.workflow(_hints("a-more", "a")):
                    raise AssertionError("a fourth busy workflow of tenant a opened")
            except APIError as refused:
                error = refused
            async with registry.workflow(_hints("b-2", "b")) as other:
                assert other.workflow is not one.workflow
        await registry.close()
    assert open_ids == {"b-1", "a-2", "a-3", "a-4"}  # a's oldest two ended, b's kept
    assert (error.status, error.code) == (429, "too_many_workflows")
    assert "of this tenant" in error.message
    states = {r.workflow_id: r.state for r in registry.records()}
    assert states["b-1"] == "closed"  # tenant a never ended it


async def test_at_the_global_limit_the_tenant_holding_the_most_gives_way():
    async with pbkv.open_runtime(engine="sim") as runtime:
        registry = SessionRegistry(runtime, max_sessions=4, max_sessions_per_tenant=4)
        for wid, tenant in (("b-1", "b"), ("a-1", "a"), ("a-2", "a"), ("a-3", "a")):
            async with registry.workflow(_hints(wid, tenant)):
                pass
        async with registry.workflow(_hints("c-1", "c")):
            pass
        states = {r.workflow_id: r.state for r in registry.records()}
        await registry.close()
    assert (states["a-1"], states["b-1"]) == ("idle", "active")


async def test_one_request_ids_are_random_not_a_count():
    async with pbkv.open_runtime(engine="sim") as runtime:
        registry = SessionRegistry(runtime)
        ids = []
        for _ in range(3):
            async with registry.workflow(_hints(None, "")) as lease:
                ids.append(lease.workflow_id)
    assert len(set(ids)) == 3
    assert all(re.fullmatch(r"req-[0-9a-f]{16}", i) for i in ids), ids
