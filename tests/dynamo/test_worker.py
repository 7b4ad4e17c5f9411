"""What the pbkv worker reads of a Dynamo request (integrations/dynamo/worker.py); needs
Dynamo installed (the module imports it), so collected with the stack tests."""

import pytest

pytestmark = pytest.mark.dynamo_stack


def hints(request, metadata=None):
    from pbkv.integrations.dynamo.worker import request_hints

    return request_hints({"token_ids": [1], **request}, metadata or {}, 64)


def test_the_session_is_the_workflow_and_final_ends_it():
    h = hints(
        {"agent_context": {"session_id": " wf-1 ", "session_final": True}},
        {"agent": "coder"},
    )
    assert (h.workflow_id, h.agent, h.final, h.max_new_tokens) == ("wf-1", "coder", True, 64)


def test_a_request_without_a_session_is_a_one_call_workflow():
    h = hints({"stop_conditions": {"max_tokens": 5}})
    assert (h.workflow_id, h.agent, h.final, h.max_new_tokens) == (None, "agent", True, 5)


def test_the_router_services_agent_is_read_when_no_metadata_names_one():
    h = hints({"agent_context": {"session_id": "w"}, "extra_args": {"pbkv": {"agent": "tester"}}})
    assert (h.agent, h.final) == ("tester", False)
    h = hints({"extra_args": {"pbkv": {"agent": "tester"}}}, {"agent": "coder"})
    assert h.agent == "coder"
