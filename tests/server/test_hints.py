"""Workflow hints resolved from headers, the pbkv body object, cache_salt and API keys."""

import pytest

from pbkv.server.errors import APIError
from pbkv.server.hints import Hints, key_tenant, resolve_hints
from pbkv.server.schemas import WorkflowHints


def test_no_hints_is_a_one_request_workflow_of_the_default_agent():
    assert resolve_hints({}, None, cache_salt=None, tenant="") == Hints(
        None, "assistant", False, ""
    )


def test_headers_name_workflow_agent_and_final():
    headers = {"x-pbkv-workflow-id": "t1", "x-pbkv-agent": "coder", "x-pbkv-final": "True"}
    assert resolve_hints(headers, None, cache_salt=None, tenant="") == Hints(
        "t1", "coder", True, ""
    )


def test_dynamo_session_header_is_an_alias_and_pbkv_header_wins():
    assert resolve_hints({"x-dynamo-session-id": "s9"}, None, cache_salt=None, tenant="")[0] == (
        "s9"
    )
    both = {"x-pbkv-workflow-id": "p", "x-dynamo-session-id": "d"}
    assert resolve_hints(both, None, cache_salt=None, tenant="").workflow_id == "p"
    final = {"x-dynamo-session-id": "d", "x-dynamo-session-final": "1"}
    assert resolve_hints(final, None, cache_salt=None, tenant="").final


def test_body_object_wins_over_headers():
    headers = {"x-pbkv-workflow-id": "from-header", "x-pbkv-agent": "planner"}
    body = WorkflowHints(workflow_id="from-body", agent="tester", final=True)
    assert resolve_hints(headers, body, cache_salt=None, tenant="") == Hints(
        "from-body", "tester", True, ""
    )
    partial = WorkflowHints(agent="tester")
    assert resolve_hints(headers, partial, cache_salt=None, tenant="") == Hints(
        "from-header", "tester", False, ""
    )


def test_bad_final_header_names_the_header():
    with pytest.raises(APIError) as info:
        resolve_hints({"x-pbkv-final": "maybe"}, None, cache_salt=None, tenant="")
    assert info.value.status == 400
    assert info.value.param == "x-pbkv-final"
    assert "maybe" in info.value.message


def test_cache_salt_namespaces_within_the_key_tenant():
    assert resolve_hints({}, None, cache_salt="s", tenant="").tenant == "s"
    assert resolve_hints({}, None, cache_salt="s", tenant="acme").tenant == "acme/s"
    assert resolve_hints({}, None, cache_salt=None, tenant="acme").tenant == "acme"


def test_api_key_tenants():
    keys = {"k1": "acme", "k2": "globex"}
    assert key_tenant({"authorization": "Bearer k2"}, keys) == "globex"
    assert key_tenant({"authorization": "Bearer anything"}, None) == ""
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic k1"}):
        with pytest.raises(APIError) as info:
            key_tenant(headers, keys)
        assert info.value.status == 401
        assert info.value.code == "invalid_api_key"


def test_a_body_final_false_beats_a_final_header_and_absent_leaves_it():
    headers = {"x-pbkv-workflow-id": "w", "x-pbkv-final": "true"}
    no = WorkflowHints(final=False)
    assert not resolve_hints(headers, no, cache_salt=None, tenant="").final
    assert resolve_hints(headers, WorkflowHints(agent="a"), cache_salt=None, tenant="").final
    assert resolve_hints({}, WorkflowHints(final=True), cache_salt=None, tenant="").final


def test_the_account_is_the_key_tenant_or_without_keys_the_salt():
    assert resolve_hints({}, None, cache_salt="s", tenant="acme").account == "acme"
    assert resolve_hints({}, None, cache_salt="s", tenant="").account == "s"
    assert resolve_hints({}, None, cache_salt=None, tenant="").account == ""
