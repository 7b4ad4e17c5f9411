"""LangChain's ``with_structured_output`` against ``pbkv serve`` (sim engine): the
``response_format`` json_schema and named ``tool_choice`` paths both get a schema-valid
reply that parses into the caller's model."""

from __future__ import annotations

from pydantic import BaseModel

from pbkv.integrations.langchain import chat_model
from pbkv.server import ServerConfig
from tests.server.conftest import serving


class Plan(BaseModel):
    steps: list[str]
    done: bool


async def test_with_structured_output_parses_the_sims_schema_valid_reply():
    async with serving(ServerConfig(port=0), engine="sim") as served:
        llm = chat_model(
            base_url=served.server.address.base_url,
            model=served.runtime.model_name,
            max_retries=0,
        )

        def ask() -> list[Plan]:
            return [
                llm.with_structured_output(Plan, method=method).invoke("Plan it.")
                for method in ("json_schema", "function_calling")
            ]

        plans = await served.run(ask)
    assert plans == [Plan(steps=["text"], done=True)] * 2
