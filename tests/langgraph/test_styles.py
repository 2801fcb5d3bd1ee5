"""Every way of running a LangGraph graph records the trainable model's calls token-exactly.

Each test compiles a real `StateGraph` whose nodes call the trainable chat model and runs
it in one execution style: `ainvoke`, sync `invoke` in a thread, `astream` in each
stream mode, `astream_events`, `Send` fan-out, subgraphs, `with_structured_output` and
`bind_tools` with a forced `tool_choice`. Every captured call must carry the prompt ids
the server rendered, the completion ids of the reply the node got, one logprob per
completion token, `trainable=True`, and the node (and node path) it ran in. A call of
the trainable model that cannot train (its reply carried no ids) must say so.

Left out: what the graph does with the replies (the tiny model is random), and
interrupts (a run that stops and resumes is another feature's tests).
"""

from __future__ import annotations

import asyncio
import operator
import threading
import uuid
import warnings
from datetime import timedelta
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Send
from pydantic import BaseModel

import art_langgraph as art
from art_langgraph.tracing.callback import ART_METADATA_KEY
from tests.langgraph.test_chat_model_capture import _rendered_ids
from tests.langgraph.tools import add, get_weather

PROMPT = "Tell me about the sea"
USER = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
async def styles_model(lg_backend: art.LocalBackend) -> art.TrainableModel:
    """One untrained model for the whole file: no test trains it."""
    model = art.TrainableModel(name="styles", project="lg", base_model="tiny")
    await model.register(lg_backend)
    return model


def _assert_exact(
    call: art.LLMCall,
    backend: art.LocalBackend,
    reply: AIMessage,
    *,
    node: str,
    namespace: list[str] | None = None,
    messages: list[dict[str, Any]] = USER,
) -> None:
    """The call is trainable, token-exact against the server and the reply, and placed."""
    assert call.trainable, call
    assert call.node == node and call.namespace == (namespace or [node])
    assert call.messages == messages
    assert call.prompt_token_ids == _rendered_ids(backend, messages, call.tools)
    assert call.completion_token_ids and call.completion_token_ids == list(
        reply.response_metadata["token_ids"]
    )
    assert call.logprobs is not None and len(call.logprobs) == len(call.completion_token_ids)


def _agent_graph(llm: Any, *, checkpointer: Any = None) -> tuple[Any, list[AIMessage]]:
    """START -> agent (one call of `llm`, sync or async as the graph is run) -> END; the
    replies the node got are appended to the returned list."""
    replies: list[AIMessage] = []

    def record(reply: AIMessage) -> dict[str, Any]:
        get_stream_writer()({"agent": "called"})  # something for stream_mode="custom"
        replies.append(reply)
        return {"messages": [reply]}

    def agent(state: MessagesState) -> dict[str, Any]:
        return record(llm.invoke(state["messages"]))

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return record(await llm.ainvoke(state["messages"]))

    graph = StateGraph(MessagesState)
    graph.add_node("agent", RunnableLambda(agent, afunc=aagent))
    graph.add_edge(START, "agent")
    graph.add_edge("agent", END)
    return graph.compile(checkpointer=checkpointer), replies


def _thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:8]}"}}


async def test_ainvoke(lg_backend: art.LocalBackend, styles_model: art.TrainableModel) -> None:
    app, replies = _agent_graph(styles_model.chat_model(max_tokens=6))
    with art.capture() as traj:
        await app.ainvoke({"messages": [("user", PROMPT)]})
    (call,), (reply,) = traj.calls, replies
    _assert_exact(call, lg_backend, reply, node="agent")
    assert call.graph_step == 1


@pytest.mark.parametrize("how", ["to_thread", "threading.Thread"])
async def test_sync_invoke_in_a_thread(
    lg_backend: art.LocalBackend, styles_model: art.TrainableModel, how: str
) -> None:
    app, replies = _agent_graph(styles_model.chat_model(max_tokens=6))
    inputs: Any = {"messages": [("user", PROMPT)]}
    if how == "to_thread":  # the capture is opened here; to_thread copies the context
        with art.capture() as traj:
            await asyncio.to_thread(app.invoke, inputs)
    else:  # a plain thread starts with an empty context: the capture opens inside it
        done: list[art.Trajectory] = []

        def work() -> None:
            with art.capture() as t:
                app.invoke(inputs)
            done.append(t)

        worker = threading.Thread(target=work)
        worker.start()
        await asyncio.to_thread(worker.join)
        (traj,) = done
    (call,), (reply,) = traj.calls, replies
    _assert_exact(call, lg_backend, reply, node="agent")


STREAM_MODES: list[Any] = [
    "values",
    "updates",
    "messages",
    "custom",
    "debug",
    "checkpoints",
    "tasks",
    ["updates", "messages", "custom", "debug"],
]


@pytest.mark.parametrize("mode", STREAM_MODES, ids=str)
async def test_astream_in_each_mode(
    lg_backend: art.LocalBackend, styles_model: art.TrainableModel, mode: Any
) -> None:
    app, replies = _agent_graph(styles_model.chat_model(max_tokens=6), checkpointer=InMemorySaver())
    config = _thread()
    with art.capture() as traj:
        items = [
            x async for x in app.astream({"messages": [("user", PROMPT)]}, config, stream_mode=mode)
        ]
    (call,), (reply,) = traj.calls, replies
    _assert_exact(call, lg_backend, reply, node="agent")
    assert call.thread_id == config["configurable"]["thread_id"] and call.checkpoint_id
    if isinstance(mode, list):
        assert {m for m, _ in items} == set(mode)
    elif mode == "messages":  # the streamed tokens are the reply the call recorded
        assert "".join(str(chunk.content) for chunk, _ in items) == reply.content
    else:
        assert items


async def test_astream_events(
    lg_backend: art.LocalBackend, styles_model: art.TrainableModel
) -> None:
    app, replies = _agent_graph(styles_model.chat_model(max_tokens=6))
    with art.capture() as traj:
        events = [
            e async for e in app.astream_events({"messages": [("user", PROMPT)]}, version="v2")
        ]
    (call,), (reply,) = traj.calls, replies
    _assert_exact(call, lg_backend, reply, node="agent")
    assert any(e["event"] == "on_chat_model_stream" for e in events)


class _Fan(TypedDict):
    topics: list[str]
    answers: Annotated[list[str], operator.add]


class _Branch(TypedDict):
    topic: str


@pytest.mark.parametrize("run", ["ainvoke", "invoke in a thread"])
async def test_send_fan_out_runs_branches_concurrently_without_mixing(
    lg_backend: art.LocalBackend, styles_model: art.TrainableModel, run: str
) -> None:
    llm = styles_model.chat_model(max_tokens=6)
    replies: dict[str, AIMessage] = {}

    def prompt(state: _Branch) -> list[tuple[str, str]]:
        return [("user", f"Write about {state['topic']}")]

    def keep(state: _Branch, reply: AIMessage) -> dict[str, Any]:
        replies[state["topic"]] = reply
        return {"answers": [str(reply.content)]}

    def branch(state: _Branch) -> dict[str, Any]:
        return keep(state, llm.invoke(prompt(state)))

    async def abranch(state: _Branch) -> dict[str, Any]:
        return keep(state, await llm.ainvoke(prompt(state)))

    graph = StateGraph(_Fan)
    graph.add_node("branch", RunnableLambda(branch, afunc=abranch))
    graph.add_conditional_edges(
        START, lambda s: [Send("branch", {"topic": t}) for t in s["topics"]], ["branch"]
    )
    graph.add_edge("branch", END)
    app: Any = graph.compile()
    topics = ["ships", "whales", "storms", "islands"]
    with art.capture() as traj:
        if run == "ainvoke":
            await app.ainvoke({"topics": topics, "answers": []})
        else:
            await asyncio.to_thread(app.invoke, {"topics": topics, "answers": []})
    assert len(traj.calls) == len(topics) and set(replies) == set(topics)
    for call in traj.calls:
        topic = call.messages[0]["content"].removeprefix("Write about ")
        mine = [{"role": "user", "content": f"Write about {topic}"}]
        _assert_exact(call, lg_backend, replies[topic], node="branch", messages=mine)
    assert len({c.messages[0]["content"] for c in traj.calls}) == len(topics)
    # concurrent: every branch's call started before any of them ended
    spans = [
        (c.started_at, c.started_at + timedelta(seconds=c.latency_s))
        for c in traj.calls
        if c.started_at is not None and c.latency_s is not None
    ]
    assert len(spans) == len(topics) and max(s for s, _ in spans) < min(e for _, e in spans)


@pytest.mark.parametrize(
    ("how", "run"),
    [("as a node", "ainvoke"), ("called in a node", "ainvoke"), ("as a node", "astream")],
)
async def test_a_subgraph_call_carries_its_node_path(
    lg_backend: art.LocalBackend, styles_model: art.TrainableModel, how: str, run: str
) -> None:
    llm = styles_model.chat_model(max_tokens=6)
    replies: list[AIMessage] = []

    async def inner_node(state: MessagesState) -> dict[str, Any]:
        replies.append(await llm.ainvoke(state["messages"]))
        return {"messages": [replies[-1]]}

    inner = StateGraph(MessagesState)
    inner.add_node("inner", inner_node)
    inner.add_edge(START, "inner")
    inner.add_edge("inner", END)
    inner_app = inner.compile()

    async def outer_node(state: MessagesState) -> dict[str, Any]:
        return await inner_app.ainvoke(state)

    outer = StateGraph(MessagesState)
    outer.add_node("outer", inner_app if how == "as a node" else outer_node)
    outer.add_edge(START, "outer")
    outer.add_edge("outer", END)
    app: Any = outer.compile()
    inputs: Any = {"messages": [("user", PROMPT)]}
    with art.capture() as traj:
        if run == "ainvoke":
            await app.ainvoke(inputs)
        else:
            streamed = [
                x async for x in app.astream(inputs, stream_mode="messages", subgraphs=True)
            ]
            assert {ns for ns, _ in streamed} and all(
                ns[0].startswith("outer:") for ns, _ in streamed
            )
    (call,), (reply,) = traj.calls, replies
    _assert_exact(call, lg_backend, reply, node="inner", namespace=["outer", "inner"])


class Verdict(BaseModel):
    ok: bool


# langchain-openai's own `model_dump()` of openai's stream events, on every streamed chunk
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
@pytest.mark.parametrize(
    "run", ["ainvoke", "astream messages", "astream_events", "sync stream messages"]
)
async def test_with_structured_output(
    lg_backend: art.LocalBackend, styles_model: art.TrainableModel, run: str
) -> None:
    """Streamed (the "messages" mode, astream_events), langchain-openai sends these through
    openai's `beta.chat.completions.stream`, whose chunks arrive wrapped in events."""
    llm = styles_model.chat_model(max_tokens=24, temperature=0).with_structured_output(
        Verdict, include_raw=True
    )
    outs: list[dict[str, Any]] = []

    def judge(state: MessagesState) -> dict[str, Any]:
        outs.append(llm.invoke(state["messages"]))
        return {"messages": [outs[-1]["raw"]]}

    async def ajudge(state: MessagesState) -> dict[str, Any]:
        outs.append(await llm.ainvoke(state["messages"]))
        return {"messages": [outs[-1]["raw"]]}

    graph = StateGraph(MessagesState)
    graph.add_node("judge", RunnableLambda(judge, afunc=ajudge))
    graph.add_edge(START, "judge")
    graph.add_edge("judge", END)
    app: Any = graph.compile()
    inputs: Any = {"messages": [("user", PROMPT)]}
    with art.capture() as traj:
        if run == "ainvoke":
            await app.ainvoke(inputs)
        elif run == "astream messages":
            assert [x async for x in app.astream(inputs, stream_mode="messages")]
        elif run == "astream_events":
            assert [e async for e in app.astream_events(inputs, version="v2")]
        else:
            assert await asyncio.to_thread(lambda: list(app.stream(inputs, stream_mode="messages")))
    (call,), (out,) = traj.calls, outs
    assert isinstance(out["parsed"], Verdict), out
    _assert_exact(call, lg_backend, out["raw"], node="judge")
    assert call.model == f"{styles_model.name}@0"


@pytest.mark.parametrize(
    ("tool_choice", "run"), [("required", "ainvoke"), ("add", "ainvoke"), ("add", "astream")]
)
async def test_bind_tools_with_a_forced_choice_and_a_tool_node(
    lg_backend: art.LocalBackend, styles_model: art.TrainableModel, tool_choice: str, run: str
) -> None:
    tools = [add, get_weather]
    llm = styles_model.chat_model(max_tokens=60, temperature=0).bind_tools(
        tools, tool_choice=tool_choice
    )
    replies: list[AIMessage] = []

    async def agent(state: MessagesState) -> dict[str, Any]:
        replies.append(await llm.ainvoke(state["messages"]))
        return {"messages": [replies[-1]]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "tools")
    graph.add_edge("tools", END)
    app: Any = graph.compile()
    inputs: Any = {"messages": [("user", "What is 2 plus 3?")]}
    with art.capture() as traj:
        if run == "ainvoke":
            await app.ainvoke(inputs)
        else:
            assert [x async for x in app.astream(inputs, stream_mode=["messages", "updates"])]
    (call,), (reply,) = traj.calls, replies
    _assert_exact(
        call,
        lg_backend,
        reply,
        node="agent",
        messages=[{"role": "user", "content": "What is 2 plus 3?"}],
    )
    assert call.tools and {t["function"]["name"] for t in call.tools} == {"add", "get_weather"}
    assert (
        reply.tool_calls
        and call.response_message["tool_calls"][0]["id"] == reply.tool_calls[0]["id"]
    )
    if tool_choice == "add":
        assert reply.tool_calls[0]["name"] == "add"
    # the ToolNode ran each call (several run concurrently, finishing in any order)
    ran = {e.tool_call_id: e.name for e in traj.tool_events}
    assert ran == {tc["id"]: tc["name"] for tc in reply.tool_calls}


# --------------------------------------------------------- a call that cannot train


async def test_a_trainable_call_without_ids_warns_once_per_trajectory(
    styles_model: art.TrainableModel,
) -> None:
    # A request that turns the backend's token ids off.
    chat = styles_model.chat_model(max_tokens=4, extra_body={"return_token_ids": False})
    app, _ = _agent_graph(chat)
    with pytest.warns(UserWarning, match="node 'agent'") as caught, art.capture() as traj:
        await app.ainvoke({"messages": [("user", PROMPT)]})
        await app.ainvoke({"messages": [("user", PROMPT)]})
    assert [c.trainable for c in traj.calls] == [False, False]
    ours = [w for w in caught if "cannot train" in str(w.message)]
    assert len(ours) == 1
    (line,) = [line for line in traj.logs if "cannot train" in line]
    assert "node 'agent'" in line and "no token ids" in line


async def test_the_responses_api_path_is_captured_and_trains(
    styles_model: art.TrainableModel,
) -> None:
    """`use_responses_api=True` sends /v1/responses through the same capturing transport:
    the call is recorded with its ids, at its node, and trains."""
    app, _ = _agent_graph(styles_model.chat_model(max_tokens=4, use_responses_api=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "cannot train" warning
        with art.capture() as traj:
            await app.ainvoke({"messages": [("user", PROMPT)]})
    (call,) = traj.calls
    assert call.trainable and call.node == "agent" and call.completion_token_ids
    assert call.raw_response is not None and call.raw_response["object"] == "response"
    with art.capture(seed=3) as seeded:  # a seeded block's seed rides in the body
        await app.ainvoke({"messages": [("user", PROMPT)]})
    assert seeded.calls[0].sampling["seed"] == art.derive_seed(3, 0)


def test_the_warning_names_the_call_and_spares_other_models() -> None:
    handler = art.TrajectoryCallback()
    reply = LLMResult(generations=[[ChatGeneration(message=AIMessage("hi"))]])
    for trainable in (False, True):
        run_id = uuid.uuid4()
        handler.on_chat_model_start(
            {}, [[]], run_id=run_id, metadata={ART_METADATA_KEY: trainable} if trainable else {}
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            handler.on_llm_end(reply, run_id=run_id)
        assert [str(w.message) for w in caught if "cannot train" in str(w.message)] == (
            [handler.trajectory.logs[-1]] if trainable else []
        )
    assert "outside any graph node" in handler.trajectory.logs[-1]
    assert [c.trainable for c in handler.trajectory.calls] == [False, False]


async def test_a_reply_the_client_refuses_to_parse_is_still_recorded_to_train(
    styles_model: art.TrainableModel, lg_backend: art.LocalBackend
) -> None:
    """openai's parser raises LengthFinishReasonError on a structured reply cut by
    max_tokens, after the server sampled it: the sampled tokens are recorded (a reward can
    punish them), with the error, and the graph's exception reaches the caller."""
    import openai

    # json_schema: its grammar cannot close an object in 2 tokens. json_mode could (`{}`),
    # and then the reply ends on "stop" and fails the Verdict validation instead.
    llm = styles_model.chat_model(max_tokens=2).with_structured_output(
        Verdict, method="json_schema"
    )

    async def node(state: MessagesState) -> dict[str, Any]:
        await llm.ainvoke(state["messages"])
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", node)
    graph.add_edge(START, "agent")
    with art.capture() as traj, pytest.raises(openai.LengthFinishReasonError):
        await graph.compile().ainvoke({"messages": [("user", PROMPT)]})
    (call,) = traj.calls
    assert call.trainable and call.node == "agent" and call.finish_reason == "length"
    assert call.prompt_token_ids == _rendered_ids(lg_backend, USER)
    assert call.completion_token_ids and len(call.completion_token_ids) == 2
    assert "LengthFinishReasonError" in call.metadata["art_client_error"]
    assert any(line.startswith("LLM call failed") for line in traj.logs)
