"""Tests for server/sessions.py: client workflow ids mapped to live workflows.

A client's id must always open (or join) its own workflow: never another tenant's, and
never fail because the same id's previous workflow is still finishing a request.
"""

from __future__ import annotations

import pbkv
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
