"""A real LangGraph StateGraph with a conditional retry edge, served by pbkv serve.

The graph is Planner -> Coder -> Tester => {Coder (retry), END}, the paper's Fig. 1 shape;
the chat model is :func:`pbkv.integrations.langchain.chat_model`, the app's one changed
line. Each thread must be one workflow whose agents are the node names.
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from pbkv.integrations.langchain import chat_model
from tests.server.conftest import Served

ROLES = {
    "planner": "You are the planner. Break the task into steps.",
    "coder": "You are the coder. Write the code for the plan.",
    "tester": "You are the tester. Say PASS or FAIL.",
}


class State(TypedDict):
    task: str
    failures_left: int
    transcript: Annotated[list[str], operator.add]


def build_graph(llm):
    def agent(name: str):
        def node(state: State) -> dict:
            messages = [SystemMessage(ROLES[name]), HumanMessage(state["task"])]
            messages += [HumanMessage(line) for line in state["transcript"]]
            reply = llm.invoke(messages)
            update: dict = {"transcript": [f"{name}: {reply.content}"]}
            if name == "tester":
                update["failures_left"] = state["failures_left"] - 1  # this test's verdict
            return update

        return node

    def after_test(state: State) -> str:
        # the tiny model's text is random: the test's verdict is scripted by the state
        return "coder" if state["failures_left"] > 0 else END  # retry edge

    graph = StateGraph(State)
    for name in ROLES:
        graph.add_node(name, agent(name))
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "coder")
    graph.add_edge("coder", "tester")
    graph.add_conditional_edges("tester", after_test, {"coder": "coder", END: END})
    return graph.compile(checkpointer=InMemorySaver())


def greedy_model(served: Served, *, max_tokens: int):
    """The app's one changed line: pbkv's chat model for the served tiny model, greedy."""
    return chat_model(
        base_url=served.server.address.base_url,
        model="tiny",
        temperature=0,
        max_tokens=max_tokens,
        max_retries=0,
        timeout=60,
    )


async def test_langgraph_threads_are_workflows_and_nodes_are_agents(served: Served):
    llm = greedy_model(served, max_tokens=4)
    app = build_graph(llm)

    def run(thread: str, failures: int) -> State:
        state = {"task": f"Sort numbers ({thread}).", "failures_left": failures, "transcript": []}
        return app.invoke(state, {"configurable": {"thread_id": thread}})

    first = await served.run(run, "thread-a", 3)  # tests 1 and 2 fail: two retries
    second = await served.run(run, "thread-b", 1)  # the first test passes
    stats = served.runtime.statistics()
    records = {r.workflow_id: r for r in served.server.sessions.records()}
    assert [line.split(":")[0] for line in first["transcript"]] == [
        "planner",
        "coder",
        "tester",
        "coder",
        "tester",
        "coder",
        "tester",
    ]
    assert [line.split(":")[0] for line in second["transcript"]] == ["planner", "coder", "tester"]
    assert set(records) == {"thread-a", "thread-b"}  # one workflow per thread, none per call
    assert stats.agents_by_workflow == {
        "thread-a": ("planner", "coder", "tester"),
        "thread-b": ("planner", "coder", "tester"),
    }
    assert records["thread-a"].agents == [
        "planner",
        "coder",
        "tester",
        "coder",
        "tester",
        "coder",
        "tester",
    ]
    assert (records["thread-a"].requests, records["thread-b"].requests) == (7, 3)
    assert stats.kv.cached_gpu_tokens > 0  # later nodes reuse the thread's shared prefix


async def test_streamed_calls_in_a_graph_carry_the_thread_and_node(served: Served):
    # langchain_core calls the model's _stream/_astream without a callback manager: the
    # hints come from the run config of the node instead
    import asyncio

    llm = greedy_model(served, max_tokens=3)

    def one_node(name: str, node) -> object:
        graph = StateGraph(State)
        graph.add_node(name, node)
        graph.add_edge(START, name)
        graph.add_edge(name, END)
        return graph.compile()

    def streams(state: State) -> dict:  # llm.stream inside a node
        text = "".join(str(c.content) for c in llm.stream([HumanMessage(state["task"])]))
        return {"transcript": [text]}

    async def astreams(state: State) -> dict:  # llm.astream inside a node
        chunks = [c async for c in llm.astream([HumanMessage(state["task"])])]
        return {"transcript": ["".join(str(c.content) for c in chunks)]}

    async def invokes(state: State) -> dict:  # ainvoke, streamed by stream_mode="messages"
        return {"transcript": [str((await llm.ainvoke([HumanMessage(state["task"])])).content)]}

    def run() -> None:
        state = {"task": "Sort numbers.", "failures_left": 0, "transcript": []}
        one_node("streamer", streams).invoke(state, {"configurable": {"thread_id": "t-stream"}})

        async def run_async() -> None:
            graph = one_node("astreamer", astreams)
            await graph.ainvoke(state, {"configurable": {"thread_id": "t-astream"}})
            graph = one_node("invoker", invokes)
            config = {"configurable": {"thread_id": "t-messages"}}
            async for _ in graph.astream(state, config, stream_mode="messages"):
                pass

        asyncio.run(run_async())

    await served.run(run)
    records = {r.workflow_id: r.agents for r in served.server.sessions.records()}
    assert records == {
        "t-stream": ["streamer"],
        "t-astream": ["astreamer"],
        "t-messages": ["invoker"],
    }
