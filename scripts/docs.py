"""Regenerate the config tables of docs/configuration.md from the config classes (the one
source of the docs, the CLI flags and validation).

.venv/bin/python scripts/docs.py          # rewrite the tables
.venv/bin/python scripts/docs.py --check  # exit 1 if the page is stale (the tests run this)

Left out: the benchmark tables, which each benchmark writes itself (bench/readme.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from art_langgraph import EngineChoice, ModelConfig, ServerChoice, TrainConfig, TrainerChoice
from art_langgraph.backend.api.server import BackendServerConfig
from art_langgraph.engine import TorchEngineConfig
from art_langgraph.engine.vllm_config import VLLMEngineConfig
from art_langgraph.integrations.langfuse import LangfuseConfig
from art_langgraph.serving import ServerConfig
from art_langgraph.training.config import config_table
from art_mcp import HarnessConfig
from bench.readme import CONFIGURATION, update_docs


def tables() -> dict[str, str]:
    from dataclasses import MISSING, fields

    def dataclass_table(cls: type) -> str:
        rows = ["| field | default | meaning |", "|---|---|---|"]
        for f in fields(cls):
            default = f.default if f.default_factory is MISSING else f.default_factory()
            rows.append(f"| `{f.name}` | `{default}` | {_attr_doc(cls, f.name)} |")
        return "\n".join(rows)

    return {
        "TrainConfig": config_table(TrainConfig),
        "ModelConfig": config_table(ModelConfig),
        "EngineChoice": dataclass_table(EngineChoice),
        "TrainerChoice": dataclass_table(TrainerChoice),
        "ServerChoice": dataclass_table(ServerChoice),
        "TorchEngineConfig": dataclass_table(TorchEngineConfig),
        "VLLMEngineConfig": dataclass_table(VLLMEngineConfig),
        "ServerConfig": config_table(ServerConfig),
        "BackendServerConfig": config_table(BackendServerConfig),
        "HarnessConfig": config_table(HarnessConfig),
        "LangfuseConfig": config_table(LangfuseConfig),
    }


def _attr_doc(cls: type, name: str) -> str:
    """The docstring under a dataclass field, read from the source."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for i, node in enumerate(body):
        if (
            isinstance(node, ast.AnnAssign)
            and getattr(node.target, "id", None) == name
            and i + 1 < len(body)
        ):
            nxt = body[i + 1]
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                return " ".join(str(nxt.value.value).split())
    return ""


def main() -> int:
    check = "--check" in sys.argv
    page = CONFIGURATION
    before = page.read_text()
    for name, text in tables().items():
        if not update_docs(name, text, page, kind="config"):
            print(f"{page.name} has no markers for {name}", file=sys.stderr)
            return 1
    if check and page.read_text() != before:
        page.write_text(before)
        print(f"{page} config tables are stale: run scripts/docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
