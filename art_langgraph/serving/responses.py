"""`ResponsesService`: OpenAI's Responses API (`POST /v1/responses`) on top of `ChatService`.

A request is checked (`unsupported` refuses stored state, background mode, built-in
tools, ...: a 400 naming the parameter, code `unsupported_parameter`), validated as a
`ResponsesRequest`, and translated into the equivalent chat completion
(`responses_protocol.chat_body`), which `ChatService` plans and runs as any other: same
engine, adapters, chat template, tool-call parsing and constrained `tool_choice`. Its
result comes back as a Responses `ResponseObject` (a `message` item and/or
`function_call` items, usage in input/output tokens), or, streaming, as OpenAI's
server-sent events: `response.created`, `response.in_progress`, then per output item
`response.output_item.added`, for a message `response.content_part.added`,
`response.output_text.delta`..., `response.output_text.done`,
`response.content_part.done`, for a function call
`response.function_call_arguments.delta` and `.done`, then `response.output_item.done`,
and last `response.completed` (or `response.incomplete` when `max_output_tokens` cut
it) carrying the whole response. An engine failure mid-stream is an `error` event.

Streaming function calls: the model's tool-call text is held back until it parses (as on
chat completions), so each call's arguments arrive in one delta at the end. The
response of a stream is the one the same request would get without streaming.

Left out: everything `responses_protocol.unsupported` names, and `n` (one completion).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from art_langgraph.serving.chat_protocol import ChatCompletionRequest, ResponseMessage, Usage
from art_langgraph.serving.chat_service import (
    ChatService,
    Plan,
    ServiceError,
    parse_json_body,
    validation_message,
)
from art_langgraph.serving.responses_protocol import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    NamedFunctionChoice,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    chat_body,
    unsupported,
)


class ResponsesService:
    """The Responses API over `chat` (see the module doc)."""

    def __init__(self, chat: ChatService) -> None:
        self.chat = chat

    def parse(self, raw: bytes) -> tuple[ResponsesRequest, ChatCompletionRequest]:
        """Body bytes -> the request and the chat completion that answers it, or a 400."""
        body = parse_json_body(raw, self.chat.limits.max_json_depth)
        if refused := unsupported(body):
            param, message = refused
            raise ServiceError(400, message, code="unsupported_parameter", param=param)
        try:
            req = ResponsesRequest.model_validate(body)
        except ValidationError as exc:
            raise ServiceError(400, validation_message(exc.errors())) from None
        try:
            chat = ChatCompletionRequest.model_validate(chat_body(req))
        except ValueError as exc:  # a ValidationError is a ValueError too
            errors = exc.errors() if isinstance(exc, ValidationError) else None
            raise ServiceError(400, validation_message(errors) if errors else str(exc)) from None
        return req, chat

    # ----------------------------------------------------------------- responses
    def response(self, req: ResponsesRequest, plan: Plan, results: list[Any]) -> ResponseObject:
        """The engine's result as a Responses response (non-streaming)."""
        completion = self.chat.response(plan, results)
        choice = completion.choices[0]
        text_logprobs = [t.model_dump() for t in choice.logprobs.content] if choice.logprobs else []
        return self._build(
            req,
            plan,
            _new_id("resp"),
            choice.message,
            choice.finish_reason,
            completion.usage,
            token_ids=choice.token_ids,
            token_logprobs=choice.token_logprobs,
            text_logprobs=text_logprobs,
        )

    def _build(
        self,
        req: ResponsesRequest,
        plan: Plan,
        rid: str,
        message: ResponseMessage,
        finish: str | None,
        usage: Usage | None,
        *,
        token_ids: list[int] | None,
        token_logprobs: list[float] | None,
        text_logprobs: list[dict[str, Any]],
        msg_id: str | None = None,
        call_ids: list[str] | None = None,
    ) -> ResponseObject:
        incomplete = finish == "length"
        status: Any = "incomplete" if incomplete else "completed"
        output: list[OutputMessage | FunctionCallItem] = []
        calls = message.tool_calls or []
        if message.content or not calls:
            text = OutputText(text=message.content or "", logprobs=text_logprobs)
            output.append(OutputMessage(id=msg_id or _new_id("msg"), status=status, content=[text]))
        for k, tc in enumerate(calls):
            output.append(
                FunctionCallItem(
                    id=call_ids[k] if call_ids else _new_id("fc"),
                    call_id=tc["id"],
                    name=tc["function"]["name"],
                    arguments=tc["function"]["arguments"],
                )
            )
        shell = self._shell(req, plan, rid, status)
        shell.output = output
        shell.incomplete_details = IncompleteDetails() if incomplete else None
        if usage is not None:
            shell.usage = ResponseUsage(
                input_tokens=usage.prompt_tokens,
                input_tokens_details=InputTokensDetails(
                    cached_tokens=usage.prompt_tokens_details.cached_tokens
                ),
                output_tokens=usage.completion_tokens,
                total_tokens=usage.total_tokens,
            )
        if req.return_token_ids:
            shell.token_ids = token_ids
        if req.return_token_logprobs:
            shell.token_logprobs = token_logprobs
        return shell

    def _shell(self, req: ResponsesRequest, plan: Plan, rid: str, status: Any) -> ResponseObject:
        """The response's settings, as OpenAI echoes them, with no output yet."""
        choice = req.tool_choice
        return ResponseObject(
            id=rid,
            created_at=int(time.time()),
            status=status,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            metadata=req.metadata or {},
            model=plan.served.label,
            parallel_tool_calls=req.parallel_tool_calls,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            text=req.text.model_dump(by_alias=True, exclude_none=True)
            if req.text
            else {"format": {"type": "text"}},
            tool_choice=choice.model_dump()
            if isinstance(choice, NamedFunctionChoice)
            else choice or "auto",
            tools=[t.model_dump(exclude_none=True) for t in req.tools or []],
            prompt_token_ids=plan.prompt_ids if req.return_token_ids else None,
        )

    # ----------------------------------------------------------------- streaming
    async def stream(self, req: ResponsesRequest, plan: Plan) -> AsyncIterator[str]:
        """The response as OpenAI's server-sent events (see the module doc)."""
        seq = 0

        def event(kind: str, **fields: Any) -> str:
            nonlocal seq
            data = {"type": kind, "sequence_number": seq, **fields}
            seq += 1
            return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

        rid, msg_id = _new_id("resp"), _new_id("msg")
        shell = self._shell(req, plan, rid, "in_progress").model_dump()
        yield event("response.created", response=shell)
        yield event("response.in_progress", response=shell)
        text, opened, finish = "", False, None
        tool_calls: list[dict[str, Any]] | None = None
        token_ids: list[int] = []
        token_logprobs: list[float] = []
        text_logprobs: list[dict[str, Any]] = []
        usage: Usage | None = None
        where = {"item_id": msg_id, "output_index": 0, "content_index": 0}

        def open_message() -> list[str]:
            item = OutputMessage(id=msg_id, status="in_progress").model_dump()
            part = OutputText(text="").model_dump()
            return [
                event("response.output_item.added", output_index=0, item=item),
                event("response.content_part.added", **where, part=part),
            ]

        async with contextlib.aclosing(self.chat.stream_chunks(plan)) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, ServiceError):
                    yield event(
                        "error", code=chunk.code or chunk.kind, message=chunk.message, param=None
                    )
                    return
                usage = chunk.usage or usage
                for c in chunk.choices:
                    token_ids += c.token_ids or []
                    token_logprobs += c.token_logprobs or []
                    lps = [t.model_dump() for t in c.logprobs.content] if c.logprobs else []
                    text_logprobs += lps
                    if c.delta.content:
                        if not opened:
                            opened = True
                            for e in open_message():
                                yield e
                        text += c.delta.content
                        yield event(
                            "response.output_text.delta",
                            **where,
                            delta=c.delta.content,
                            logprobs=lps,
                        )
                    if c.delta.tool_calls:
                        tool_calls = [
                            {k: v for k, v in tc.items() if k != "index"}
                            for tc in c.delta.tool_calls
                        ]
                    finish = c.finish_reason or finish
        message = ResponseMessage(content=text or None, tool_calls=tool_calls)
        call_ids = [_new_id("fc") for _ in tool_calls or []]
        final = self._build(
            req,
            plan,
            rid,
            message,
            finish,
            usage,
            token_ids=token_ids,
            token_logprobs=token_logprobs,
            text_logprobs=text_logprobs,
            msg_id=msg_id,
            call_ids=call_ids,
        )
        for index, item in enumerate(final.output):
            if isinstance(item, OutputMessage):
                if not opened:
                    for e in open_message():
                        yield e
                part = item.content[0].model_dump()
                yield event(
                    "response.output_text.done",
                    **where,
                    text=part["text"],
                    logprobs=part["logprobs"],
                )
                yield event("response.content_part.done", **where, part=part)
            else:
                added = item.model_copy(update={"arguments": "", "status": "in_progress"})
                yield event(
                    "response.output_item.added", output_index=index, item=added.model_dump()
                )
                at = {"item_id": item.id, "output_index": index}
                yield event("response.function_call_arguments.delta", **at, delta=item.arguments)
                yield event(
                    "response.function_call_arguments.done",
                    **at,
                    name=item.name,
                    arguments=item.arguments,
                )
            yield event("response.output_item.done", output_index=index, item=item.model_dump())
        done = "response.incomplete" if final.status == "incomplete" else "response.completed"
        yield event(done, response=final.model_dump())


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
