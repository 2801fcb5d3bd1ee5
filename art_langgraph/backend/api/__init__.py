"""The training API over HTTP: `art-langgraph backend` serves it, `RemoteBackend` calls it.

- `server`: a `LocalBackend` behind HTTP (`create_backend_app`, `serve_backend`): the
  training API under `/art/v1` and the embedded OpenAI-compatible server under `/v1`;
- `wire`: the JSON bodies both sides agree on (gzip, idempotency keys, step events).

The client is `art_langgraph.backend.remote.RemoteBackend`, a backend like any other, so
it lives beside `LocalBackend` rather than here. Left out: the OpenAI endpoint itself
(`art_langgraph.serving`).
"""
