"""The server's outer layer (`Guard`, pure ASGI): what every HTTP request passes first.

In order: an unexpected Host header on a keyless loopback server gets 421 (a web page,
or DNS rebinding, cannot reach the model through the user's browser); a wrong or
missing API key gets 401 on `/v1`, `/art` and `/metrics`; a POST that is not `application/json` gets 415 (a
browser may send `text/plain` to any origin without asking); a body larger than
`max_body_bytes` gets 413, before it is read when `Content-Length` says so, else as
soon as the count passes the limit. Any exception the app lets escape becomes a JSON
500 in the OpenAI error shape, logged with its traceback, and the connection stays
open for the client's next request.

Left out: CORS (the API is for programs, not browsers), TLS and rate limits.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from starlette.requests import ClientDisconnect

log = logging.getLogger(__name__)

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

Scope = dict[str, Any]


def error_json(message: str, kind: str, code: str | None = None, param: str | None = None) -> bytes:
    """An OpenAI-style error body."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json.dumps(body).encode()


class _BodyTooLarge(Exception):
    pass


def _host_name(header: str) -> str:
    """'127.0.0.1:8000' -> '127.0.0.1'; '[::1]:8000' -> '::1'."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


_KEYED_PATHS = ("/v1", "/art", "/metrics", "/engine")
"""Path prefixes that need the API key when the server has one (all but `/health`;
`/engine` is a replica's token-level routes, `scaleout/replica_server.py`)."""


class Guard:
    """Wraps an ASGI app with the checks above."""

    def __init__(self, app: Any, *, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        started = False

        async def reply(status: int, body: bytes) -> None:
            nonlocal started
            if started:
                return
            started = True
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})

        if self.api_key is None and _host_name(headers.get("host", "")) not in _LOOPBACK_HOSTS:
            # A keyless server is loopback only (check_bind): any other Host is a browser
            # sent there by another site.
            await reply(421, error_json("unexpected Host header", "invalid_request_error"))
            return
        path = scope.get("path", "")
        if self.api_key is not None and path.startswith(_KEYED_PATHS):
            scheme, _, token = headers.get("authorization", "").strip().partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(
                token.strip().encode(), self.api_key.encode()
            ):
                await reply(
                    401,
                    error_json(
                        "invalid or missing API key", "authentication_error", "invalid_api_key"
                    ),
                )
                return
        if scope["method"] == "POST":
            kind = headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind != "application/json":
                await reply(
                    415,
                    error_json(
                        f"the body must be application/json, not {kind or 'untyped'!r}",
                        "invalid_request_error",
                    ),
                )
                return
            declared = headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                await reply(413, self._too_large())
                return

        seen = 0

        async def counting_receive() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise _BodyTooLarge
            return message

        async def watching_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except _BodyTooLarge:
            await reply(413, self._too_large())
        except ClientDisconnect:
            return  # the client left mid-body: nobody to answer
        except Exception:
            log.exception("unhandled error on %s %s", scope["method"], path)
            if started:
                raise  # the response is under way: only dropping the connection can tell
            await reply(500, error_json("internal server error", "server_error"))

    def _too_large(self) -> bytes:
        return error_json(
            f"the request body is larger than {self.max_body_bytes} bytes",
            "invalid_request_error",
            "request_too_large",
        )
