"""The `art-mcp` command line.

    art-mcp train --server "python my_server.py" --base-model tiny --steps 10 \\
        --scenarios scenarios.jsonl --reward my_rewards:score
    art-mcp train --server http://127.0.0.1:8000/mcp --judge local --generator local
    art-mcp scenarios --server "python my_server.py" -n 40 --out scenarios.jsonl \\
        --generator openai/gpt-4o-mini --instructions "questions a support agent gets"

Every `train` flag comes from `HarnessConfig` (one source for the docs, the flags and
validation), plus `--server`, `--scenarios`, `--reward`, `--sft` and `--env KEY=VALUE`. `--help` lists
them all with their defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from art_langgraph.errors import ArtError, UsageError
from art_langgraph.runtime.allocator import reexec_with_tcmalloc
from art_mcp.check import check
from art_mcp.config import HarnessConfig
from art_mcp.harness import train
from art_mcp.scenario_source import write_scenarios


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="art-mcp", description="Train an agent over any MCP server with GRPO."
    )
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser(
        "train",
        help="train an agent over an MCP server",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Connect to the server, load or generate scenarios, warm-start, run GRPO steps, evaluate, report.",
    )
    _train_flags(t)
    c = sub.add_parser(
        "check",
        help="pre-flight: one untrained step's rollouts, and whether the setup can learn",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Run one step's rollouts of the untrained model with train's arguments, "
        "time a step, and report success, format, reward spread, groups without signal, reward "
        "errors and the run's estimated time, with a verdict. Writes nothing under --path. "
        "Exits 0 when the setup is learnable, 1 when it says what to change.",
    )
    _train_flags(c)
    g = sub.add_parser(
        "scenarios",
        help="generate scenarios for a server's tools, write them and stop (review them first)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Ask a generator LLM for tasks the server's tools can solve; write them "
        "to --out for review; train on them later with art-mcp train --scenarios.",
    )
    g.add_argument("--server", required=True, help="the server command (stdio) or URL")
    g.add_argument("--out", required=True, help="the JSONL file to write")
    g.add_argument("-n", dest="n_scenarios", type=int, default=24, help="how many scenarios")
    g.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="as for train")
    _config_flags(
        g,
        {k: f for k, f in HarnessConfig.model_fields.items() if k in _SCENARIO_FIELDS},
    )
    return p


def _train_flags(t: argparse.ArgumentParser) -> None:
    """`train`'s arguments (and `check`'s): the server, scenarios, reward, SFT data and
    environment, and one flag per HarnessConfig field."""
    t.add_argument(
        "--server",
        required=True,
        help="a command that runs the server over stdio, or its streamable-HTTP URL",
    )
    t.add_argument(
        "--scenarios",
        default=None,
        help="a JSONL file of scenarios (else they are generated with --generator)",
    )
    t.add_argument(
        "--reward",
        default=None,
        help="module:function computing reward(trajectory, scenario) -> float",
    )
    t.add_argument(
        "--sft",
        default=None,
        help="a JSONL file of conversations for an SFT warm start (default: the scenarios' demonstrations)",
    )
    t.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a variable in a stdio server's environment (repeatable)",
    )
    _config_flags(t, HarnessConfig.model_fields)


_SCENARIO_FIELDS = (
    "base_model",
    "generator",
    "instructions",
    "scenario_tool_words",
    "allow_tools",
    "deny_tools",
    "path",
    "project",
    "engine",
    "engine_dtype",
)
"""The HarnessConfig fields `art-mcp scenarios` takes."""


def _config_flags(parser: argparse.ArgumentParser, fields: dict[str, Any]) -> None:
    """One flag per config field, with its type, default and description."""
    for name, field in fields.items():
        flag = "--" + name.replace("_", "-")
        kind: Any = field.annotation
        typ = {int: int, float: float}.get(kind, str)
        default = field.default if field.default_factory is None else field.default_factory()
        parser.add_argument(flag, dest=name, type=typ, default=default, help=field.description)


def _env(pairs: list[str]) -> dict[str, str] | None:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {pair!r}")
        env[key] = value
    return env or None


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # run as a program: on tcmalloc where installed (allocator.py)
        reexec_with_tcmalloc()
    args = _parser().parse_args(argv)
    try:
        if args.command == "scenarios":
            values = {k: getattr(args, k) for k in (*_SCENARIO_FIELDS, "n_scenarios")}
            config = HarnessConfig(**values)
            asyncio.run(write_scenarios(args.server, args.out, config, env=_env(args.env)))
            return 0
        config = HarnessConfig(**{k: getattr(args, k) for k in HarnessConfig.model_fields})
        given = {"scenarios": args.scenarios, "reward": args.reward, "env": _env(args.env)}
        if args.command == "check":
            preflight = asyncio.run(check(args.server, config, sft=args.sft, **given))
            return 0 if preflight.ok else 1
        report = asyncio.run(train(args.server, config, sft=args.sft, **given))
    except (ArtError, ValueError) as exc:
        print(f"art-mcp: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # train() said where it stopped and how to resume
        if args.command != "train":
            print("art-mcp: interrupted; nothing written", file=sys.stderr)
        return 130
    from art_mcp.report import summary_lines

    print("\n".join(summary_lines(report)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
