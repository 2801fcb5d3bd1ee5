"""TrainableChatModel inside capture(): exact token ids, streaming, isolation, errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from pydantic import BaseModel, Field

import art_langgraph as art
from tests.langgraph.tools import add, explode


def _rendered_ids(
    backend: art.LocalBackend, messages: list[dict[str, Any]], tools: Any = None
) -> list[int]:
    tok = backend.engine.tokenizer
    text = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    return tok.encode(text, add_special_tokens=False)


async def test_invoke_records_the_exact_ids(
    lg_backend: art.LocalBackend, fresh_model: art.TrainableModel
) -> None:
    llm = fresh_model.chat_model(max_tokens=12, temperature=0.8)
    with art.capture(metadata={"case": 1}) as traj:
        reply = await llm.ainvoke("Say something")
    assert isinstance(reply, AIMessage)
    assert reply.response_metadata["model_name"] == f"{fresh_model.name}@0"
    (call,) = traj.calls
    assert call.trainable and call.adapter_step == 0 and call.model == f"{fresh_model.name}@0"
    assert call.prompt_token_ids == _rendered_ids(
        lg_backend, [{"role": "user", "content": "Say something"}]
    )
    assert call.completion_token_ids == reply.response_metadata["token_ids"]
    assert call.logprobs is not None and len(call.logprobs) == len(call.completion_token_ids or [])
    assert call.sampling["temperature"] == 0.8 and call.messages == [
        {"role": "user", "content": "Say something"}
    ]
    assert traj.metadata == {"case": 1} and traj.finished_at is not None
    assert traj.messages[-1]["role"] == "assistant"


async def test_streaming_is_captured_like_invoke(fresh_model: art.TrainableModel) -> None:
    llm = fresh_model.chat_model(max_tokens=16, seed=7)
    with art.capture() as plain:
        whole = await llm.ainvoke("stream me")
    with art.capture() as streamed:
        text = "".join([str(c.content) async for c in llm.astream("stream me")])
    assert text == whole.content
    (a,), (b,) = plain.calls, streamed.calls
    assert (
        b.completion_token_ids == a.completion_token_ids
        and b.prompt_token_ids == a.prompt_token_ids
    )
    assert b.logprobs is not None and a.logprobs is not None
    assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
    assert b.model == a.model and b.trainable


def test_sync_invoke_and_batch(fresh_model: art.TrainableModel) -> None:
    llm = fresh_model.chat_model(max_tokens=4)
    with art.capture() as traj:
        llm.invoke("one")
        llm.batch(["two", "three"])
    assert sorted(c.messages[0]["content"] for c in traj.calls) == ["one", "three", "two"]
    assert all(c.completion_token_ids for c in traj.calls)


async def test_64_concurrent_rollouts_never_mix(fresh_model: art.TrainableModel) -> None:
    # timeout: a request stuck anywhere in the client stack is retried, not awaited forever
    llm = fresh_model.chat_model(max_tokens=4, timeout=60, max_retries=3)

    async def rollout(i: int) -> art.Trajectory:
        with art.capture(metadata={"i": i}) as traj:
            await llm.ainvoke(f"rollout number {i}")
            await asyncio.sleep(0)
            await llm.ainvoke(f"second call of {i}")
        return traj

    try:
        trajs = await asyncio.wait_for(asyncio.gather(*(rollout(i) for i in range(64))), 300)
    except TimeoutError:  # leave a diagnosis in the log instead of hanging CI
        for task in asyncio.all_tasks():
            task.print_stack(limit=12)
        raise
    for i, t in enumerate(trajs):
        assert t.metadata == {"i": i}
        assert [c.messages[0]["content"] for c in t.calls] == [
            f"rollout number {i}",
            f"second call of {i}",
        ]


async def test_an_exception_in_the_graph_is_recorded_and_raised(
    fresh_model: art.TrainableModel,
) -> None:
    llm = fresh_model.chat_model(max_tokens=4)

    async def crash(state: MessagesState) -> dict:
        raise ValueError("node failed")

    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda s: {"messages": [llm.invoke(s["messages"])]})
    graph.add_node("crash", crash)
    graph.add_edge(START, "model")
    graph.add_edge("model", "crash")
    app = graph.compile()
    with pytest.raises(ValueError, match="node failed"), art.capture() as traj:
        await app.ainvoke({"messages": [("user", "hi")]})
    assert traj.exception is not None and traj.exception.type == "ValueError"
    assert "node failed" in traj.exception.message and len(traj.calls) == 1


def _one_tool_graph(llm: Any, tools: list[Any]) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda s: {"messages": [llm.invoke(s["messages"])]})
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    graph.add_edge("tools", END)
    return graph.compile()


async def test_a_tool_that_raises_is_recorded_and_the_run_goes_on(
    fresh_model: art.TrainableModel,
) -> None:
    llm = fresh_model.chat_model(max_tokens=60).bind_tools([explode], tool_choice="explode")
    app = _one_tool_graph(llm, [explode])
    with art.capture() as traj:
        out = await app.ainvoke({"messages": [("user", "blow up")]})
    (event,) = traj.tool_events
    assert event.name == "explode" and event.result is None
    assert event.error is not None and "boom" in event.error
    assert event.tool_call_id == traj.calls[0].response_message["tool_calls"][0]["id"]
    assert out["messages"][-1].type == "tool" and traj.messages[-1]["role"] == "tool"


async def test_a_malformed_tool_call_is_captured_as_text(fresh_model: art.TrainableModel) -> None:
    broken = 'start: <tool_call> "\\n{\\"name\\": \\"add\\", \\"arguments\\": {bad\\n" </tool_call>'
    llm = fresh_model.chat_model(
        max_tokens=40, extra_body={"structured_outputs": {"grammar": broken}}
    ).bind_tools([add])
    app = _one_tool_graph(llm, [add])
    with art.capture() as traj:
        out = await app.ainvoke({"messages": [("user", "add 1 and 2")]})
    assert out["messages"][-1].type == "ai" and not out["messages"][-1].tool_calls
    (call,) = traj.calls
    assert call.response_message["content"].startswith("<tool_call>") and call.trainable
    assert call.completion_token_ids and not traj.tool_events


async def test_tool_calls_are_parsed_and_run(fresh_model: art.TrainableModel) -> None:
    llm = fresh_model.chat_model(max_tokens=60, seed=1).bind_tools([add], tool_choice="add")
    app = _one_tool_graph(llm, [add])
    with art.capture() as traj:
        await app.ainvoke({"messages": [("user", "add two numbers")]})
    (event,) = traj.tool_events
    call_args = traj.calls[0].response_message["tool_calls"][0]
    assert event.name == "add" and event.error is None and event.tool_call_id == call_args["id"]
    assert event.result == str(event.args["a"] + event.args["b"])  # type: ignore[index]


async def test_explicit_handler_records_other_models_as_not_trainable(
    lg_backend: art.LocalBackend, fresh_model: art.TrainableModel
) -> None:
    policy = fresh_model.chat_model(max_tokens=4)
    judge = ChatOpenAI(
        model="tiny", base_url=fresh_model.inference_base_url, api_key="local", max_tokens=4
    )  # type: ignore[arg-type]
    traj = art.Trajectory()
    handler = art.TrajectoryCallback(traj)
    await policy.ainvoke("answer", config={"callbacks": [handler]})
    await judge.ainvoke("judge it", config={"callbacks": [handler]})
    assert [c.trainable for c in traj.calls] == [True, False]
    assert traj.calls[1].model == "tiny@0"
    assert art.current_trajectory() is None  # nothing leaked into the context


async def test_with_structured_output(fresh_model: art.TrainableModel) -> None:
    class Verdict(BaseModel):
        ok: bool
        score: int = Field(ge=0, le=10)

    llm = fresh_model.chat_model(max_tokens=40).with_structured_output(
        Verdict, method="json_schema"
    )
    with art.capture() as traj:
        v = await llm.ainvoke("judge this")
    assert isinstance(v, Verdict)
    assert traj.calls and traj.calls[0].completion_token_ids


async def test_a_failing_capture_hook_never_breaks_the_graph(
    fresh_model: art.TrainableModel,
) -> None:
    llm = fresh_model.chat_model(max_tokens=4)

    class Broken(art.TrajectoryCallback):
        def _end_llm(self, response: Any, run_id: Any) -> None:
            raise RuntimeError("hook bug")

    traj = art.Trajectory()
    reply = await llm.ainvoke("still works", config={"callbacks": [Broken(traj)]})
    assert isinstance(reply, AIMessage)
    assert any("hook bug" in line for line in traj.logs)


def test_chat_models_share_loop_local_http_clients_without_finalizers() -> None:
    # The default clients of langchain_openai/openai close themselves from __del__ (an
    # aclose() scheduled on whatever loop the collector runs under), which unregistered
    # live sockets from the event loop and hung concurrent rollouts (see chat_model.py).
    import httpx

    from art_langgraph.tracing.chat_model import build_chat_model
    from art_langgraph.tracing.openai_capture import CapturingTransport

    a = build_chat_model(name="m", step=None, base_url="http://127.0.0.1:9/v1", api_key="k")
    b = build_chat_model(name="m", step=1, base_url="http://127.0.0.1:9/v1", api_key="k")
    for llm in (a, b):
        assert type(llm.http_async_client) is httpx.AsyncClient  # no __del__
        assert llm.root_async_client._client is llm.http_async_client
        assert type(llm.http_client) is httpx.Client
    # each sends through the capturing transport, over the one shared per-loop pool
    assert isinstance(a.http_async_client._transport, CapturingTransport)
    assert a.http_async_client._transport.inner is b.http_async_client._transport.inner
    transport = a.http_async_client._transport.inner

    async def pool() -> object:
        return transport._pool()

    p1, p2 = asyncio.run(pool()), asyncio.run(pool())
    assert p1 is not p2  # one pool per event loop: connections never cross loops
    assert p1 not in transport._pools.values()  # a closed loop's pool is dropped


async def test_a_chat_model_built_directly_is_trainable_with_exact_ids(
    fresh_model: art.TrainableModel,
) -> None:
    import httpx

    from art_langgraph.runtime.http_pool import shared_async_transport
    from art_langgraph.tracing.chat_model import TrainableChatModel

    sent: list[str] = []

    async def seen(request: httpx.Request) -> None:
        sent.append(request.url.path)

    own = httpx.AsyncClient(transport=shared_async_transport(), event_hooks={"request": [seen]})
    llm = TrainableChatModel(
        model=fresh_model.name,
        base_url=fresh_model.inference_base_url,
        api_key="local",  # type: ignore[arg-type]
        max_tokens=6,
        extra_body={"top_logprobs": 0},  # the user's own extras are merged, not lost
        http_async_client=own,  # kept, behind the capturing transport
    )
    with art.capture() as traj:
        await llm.ainvoke("hello")
    assert sent == ["/v1/chat/completions"]  # the user's client sent it
    (call,) = traj.calls
    assert call.trainable and call.prompt_token_ids and call.completion_token_ids
    assert call.logprobs is not None and len(call.logprobs) == len(call.completion_token_ids)
