"""The `art-langgraph` command line.

    art-langgraph serve --base-model tiny [--host 127.0.0.1] [--port 8000] [--api-key K]
    art-langgraph backend [--path .art] [--host 127.0.0.1] [--port 8090] [--api-key K]

`serve` starts the OpenAI-compatible server on the torch engine. `backend` starts the
backend server for `RemoteBackend(url)`: engine, trainer and checkpoints under `--path`,
the training API on `/art/v1` and the OpenAI endpoint on `/v1` of the same port. The API
key may also come from `$ART_API_KEY`.
"""

from __future__ import annotations

import argparse
import os
import sys

from art_langgraph.errors import UsageError

__all__ = ["main"]


def _bind_args(p: argparse.ArgumentParser, port: int, guards: str) -> None:
    """--host, --port, --api-key and --log-level, as both servers take them."""
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; others need --api-key)",
    )
    p.add_argument(
        "--port", type=int, default=port, help=f"port to bind (default {port}; 0 picks a free one)"
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("ART_API_KEY"),
        help=f"require 'Authorization: Bearer KEY' on {guards} (default: $ART_API_KEY)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="art-langgraph", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    s.add_argument(
        "--base-model",
        default="tiny",
        help="a preset ('tiny', 'smollm2-135m'), a HF id, a local folder or a .gguf file "
        "(default: tiny)",
    )
    s.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template file replacing the tokenizer's own (as vLLM's)",
    )
    _bind_args(s, 8000, "/v1")
    s.add_argument(
        "--served-name", default=None, help="the model name clients use (default: the base model)"
    )
    b = sub.add_parser("backend", help="serve the training API for RemoteBackend (and /v1)")
    b.add_argument("--path", default=".art", help="where models live on disk (default .art)")
    _bind_args(b, 8090, "/v1 and /art")
    b.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "torch", "vllm"],
        help="inference engine: torch (ours), vllm (scripts/setup-vllm.sh), auto (vLLM with a GPU)",
    )
    b.add_argument(
        "--engine-dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="the inference engine's dtype (default: the engine's choice for the device)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        from art_langgraph.backend.runner import serve

        try:
            serve(
                args.base_model,
                host=args.host,
                port=args.port,
                api_key=args.api_key or None,
                served_name=args.served_name,
                chat_template=args.chat_template,
                log_level=args.log_level,
            )
        except UsageError as exc:
            print(f"art-langgraph: error: {exc}", file=sys.stderr)
            return 2
    elif args.command == "backend":
        from art_langgraph.backend.backend_server import serve_backend

        engine_config: object = None
        if args.engine == "vllm":
            from art_langgraph.engine.vllm_engine import VLLMEngineConfig

            engine_config = VLLMEngineConfig(dtype=args.engine_dtype or "auto")
        elif args.engine_dtype:
            from art_langgraph.engine.torch_engine import TorchEngineConfig

            engine_config = TorchEngineConfig(dtype=args.engine_dtype)
        try:
            serve_backend(
                args.path,
                host=args.host,
                port=args.port,
                api_key=args.api_key or None,
                log_level=args.log_level,
                engine_config=engine_config,
                engine=args.engine,
            )
        except UsageError as exc:
            print(f"art-langgraph: error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
