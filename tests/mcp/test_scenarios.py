"""Scenarios: JSONL io, the train/val split, reply parsing, and generation against a real local endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from art_langgraph.engine import TorchEngine
from art_langgraph.errors import UsageError
from art_langgraph.serving import ModelRegistry, ServerHandle, start_server
from art_mcp import MCPToolset
from art_mcp.scenarios import (
    Scenario,
    _parse,
    generate_scenarios,
    load_scenarios,
    save_scenarios,
    split_scenarios,
)


def test_jsonl_round_trip_and_bad_lines(tmp_path: Path) -> None:
    items = [Scenario(id=f"s{i}", task=f"task number {i} é", answer=str(i)) for i in range(5)]
    save_scenarios(tmp_path / "s.jsonl", items)
    assert load_scenarios(tmp_path / "s.jsonl") == items
    (tmp_path / "bad.jsonl").write_text('{"id": "x", "task": "ok"}\n{"id": "y"}\n')
    with pytest.raises(UsageError, match=r"bad\.jsonl:2"):
        load_scenarios(tmp_path / "bad.jsonl")


def test_split_is_deterministic_and_disjoint() -> None:
    items = [Scenario(id=f"s{i:02d}", task=f"task {i}") for i in range(20)]
    train, val = split_scenarios(items, 0.25, seed=3)
    assert len(val) == 5 and len(train) == 15 and not {s.id for s in train} & {s.id for s in val}
    assert split_scenarios(list(reversed(items)), 0.25, seed=3) == (train, val)
    assert len(split_scenarios(items[:2], 0.1)[1]) == 1
    with pytest.raises(UsageError):
        split_scenarios(items, 1.0)


def test_a_scenario_s_own_split_wins() -> None:
    fixed = [Scenario(id=f"v{i}", task="t", split="val") for i in range(3)]
    fixed += [Scenario(id=f"t{i}", task="t", split="train") for i in range(4)]
    free = [Scenario(id=f"f{i:02d}", task="t") for i in range(8)]
    train, val = split_scenarios(fixed + free, 0.25, seed=1)
    assert {s.id for s in val} >= {"v0", "v1", "v2"} and len(val) == 3 + 2
    assert {s.id for s in train} >= {"t0", "t1", "t2", "t3"} and len(train) == 4 + 6
    with pytest.raises(UsageError, match="both need at least one"):
        split_scenarios([Scenario(id="a", task="t", split="val")], 0.25)


def test_reply_parsing() -> None:
    assert _parse('```json\n{"scenarios": [{"task": "add 2 and 3", "difficulty": 2}]}\n```') == [
        {"task": "add 2 and 3", "difficulty": 2}
    ]
    assert _parse('[{"task": "x"}, {"nope": 1}, {"task": "  "}]') == [{"task": "x"}]
    with pytest.raises(ValueError):
        _parse("not json")


def test_a_reply_cut_short_keeps_its_complete_items() -> None:
    cut = '{"scenarios": [{"task": "Who wrote Emma?", "difficulty": 1}, {"task": "When was Du'
    assert _parse(cut) == [{"task": "Who wrote Emma?", "difficulty": 1}]
    assert _parse('[{"task": "A b c d.", "difficulty": 2} , {"task"') == [
        {"task": "A b c d.", "difficulty": 2}
    ]
    with pytest.raises(ValueError):
        _parse('{"scenarios": [{"task": "Unterminated')


def test_the_schema_bounds_a_reply_to_its_budget() -> None:
    import re

    from art_mcp.scenarios import _ITEM_TOKENS, _SENTENCE, _schema

    longest = "A" + "b" * 14 + (" " + "c" * 15) * 14 + " " + "d" * 14 + "."
    assert re.match(_SENTENCE, longest) and not re.match(_SENTENCE, longest.replace("A", "Ab"))
    # one token per character, at worst: the longest item and its JSON fit the budget
    assert len(json.dumps({"task": longest, "difficulty": 5}) + ", ") <= _ITEM_TOKENS
    assert re.match(_SENTENCE, "Who wrote the novel Dracula, and when?")
    assert not re.match(_SENTENCE, " ".join(["Word"] * 17) + ".")  # too many words
    assert _schema(3)["properties"]["scenarios"]["maxItems"] == 3


@pytest.fixture(scope="module")
def generator_server(tiny_path: Path) -> Iterator[ServerHandle]:
    engine = TorchEngine.from_pretrained(str(tiny_path))
    with start_server(engine, ModelRegistry("tiny")) as handle:
        yield handle
    engine.close_sync()


@pytest.mark.parametrize("module", ["examples.mcp_server.server", "examples.mcp_books.server"])
async def test_generate_scenarios_with_the_local_engine(
    generator_server: ServerHandle, module: str
) -> None:
    import importlib

    server = importlib.import_module(module).server
    async with MCPToolset(server) as ts:
        scen = await generate_scenarios(
            ts,
            4,
            generator="openai/tiny",
            base_url=generator_server.base_url,
            api_key="x",
            max_tokens=400,
            require_tool_words=False,  # a random model's words name no tool
        )
    # The tiny model is random, but it decodes under the schema: the replies parse and validate.
    assert 1 <= len(scen) <= 4 and len({s.task.lower() for s in scen}) == len(scen)
    assert all(len(s.task) >= 8 and 1 <= s.difficulty <= 5 for s in scen)


def _long_tools(n: int, desc_chars: int, name_chars: int = 8) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}_" + "x" * name_chars,
                "description": f"Looks up record {i}. " + "More detail. " * (desc_chars // 13),
                "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
            },
        }
        for i in range(n)
    ]


async def test_a_prompt_too_long_for_the_generator_is_cut_and_said(
    generator_server: ServerHandle,
) -> None:
    said: list[str] = []
    scen = await generate_scenarios(
        _long_tools(20, 1500),  # ~7,000 tokens of descriptions: past the tiny model's 4,096
        2,
        generator="openai/tiny",
        base_url=generator_server.base_url,
        api_key="x",
        require_tool_words=False,
        log=said.append,
    )
    assert scen and any("cut to their first sentence" in line for line in said), said
    with pytest.raises(UsageError, match="cannot take even the names of 400 tools"):
        await generate_scenarios(
            _long_tools(400, 0, name_chars=60),
            2,
            generator="openai/tiny",
            base_url=generator_server.base_url,
            api_key="x",
            log=said.append,
        )


def test_generated_tasks_must_name_something_a_tool_reaches() -> None:
    from art_mcp.scenarios import _near_duplicate, _vocabulary, _words

    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_text_file",
                "description": "Read a file's contents.",
                "parameters": {
                    "type": "object",
                    "properties": {"unit": {"type": "string", "enum": ["Celsius", "kelvin"]}},
                },
            },
        }
    ]
    vocab = _vocabulary(tools)
    assert _words("Show me what notes.txt says in the text file") & vocab
    assert _words("Temperature in kelvin please.") & vocab  # an enum value reaches it
    assert not _words("Write a poem about the sea.") & vocab
    a, b = _words("What is the capital of France?"), _words("what is THE capital of france")
    assert _near_duplicate(a, b) and not _near_duplicate(a, _words("What is France's currency?"))


def test_too_few_scenarios_are_named_before_a_run_spends_compute() -> None:
    from art_mcp.scenarios import MIN_HELD_OUT, few_scenarios

    # what a 135M generator left of 24 over a server it never saw: 2 scenarios
    line = few_scenarios(1, 1, 8)
    assert line is not None and line.startswith("few scenarios: 1 held out: one of them is 1.00")
    assert "1 to train on for 8 groups a step" in line and "--generator" in line
    assert few_scenarios(40, MIN_HELD_OUT, 8) is None
    assert "none held out" in (few_scenarios(40, 0, 8) or "")
    only_train = few_scenarios(4, 20, 8)
    assert only_train is not None and "held out" not in only_train


def test_a_validation_slice_is_carved_from_training_entities_alone() -> None:
    from art_mcp.scenarios import Scenario, validation_scenarios

    scen = [
        Scenario(id=f"{who}-{k}", task=f"{who} {k}", split=split, metadata={"entity": who})
        for who, split in [("ann", "train"), ("bo", "train"), ("cy", "train"), ("dee", "train"),
                           ("eve", "val")]
        for k in range(3)
    ]  # fmt: skip
    carved = validation_scenarios(scen, 0.25, seed=0)
    assert {s.metadata["entity"] for s in carved} == {"ann", "bo", "cy", "dee"}  # eve dropped
    val = {s.metadata["entity"] for s in carved if s.split == "val"}
    train = {s.metadata["entity"] for s in carved if s.split == "train"}
    assert len(val) == 1 and val.isdisjoint(train) and len(carved) == 12
    assert carved == validation_scenarios(scen, 0.25, seed=0)  # the same in every process
    assert scen[0].split == "train"  # the input is left as it was


def test_a_validation_slice_holds_wordings_out_where_scenarios_name_them() -> None:
    from art_mcp.scenarios import Scenario, validation_scenarios

    wordings = {"ask": ["Who is {}?", "Name {}.", "Tell me {}.", "Find {}."], "one": ["{}?"]}
    scen = [
        Scenario(
            id=f"{kind}-{who}-{k}",
            task=w.format(who),
            split="val" if who == "zed" else "train",
            metadata={"entity": who, "kind": kind, "phrasing": w},
        )
        for who in ["ann", "bo", "cy", "dee", "eve", "fay", "gus", "hal", "zed"]
        for kind, ws in wordings.items()
        for k, w in enumerate(ws)
    ]
    carved = validation_scenarios(scen, 0.25, seed=0)
    val = [s for s in carved if s.split == "val"]
    train = [s for s in carved if s.split == "train"]
    assert val and train
    # no validation entity, and no validation wording of a kind with several, in training
    assert {s.metadata["entity"] for s in val}.isdisjoint(s.metadata["entity"] for s in train)
    asks = lambda part: {s.metadata["phrasing"] for s in part if s.metadata["kind"] == "ask"}  # noqa: E731
    assert len(asks(val)) == 1 and len(asks(train)) == 3
    # a kind worded one way splits by entity alone: each entity keeps its "one" question
    assert sum(s.metadata["kind"] == "one" for s in carved) == 8
    # 2 validation entities x 1 wording + 6 training entities x 3 wordings of "ask"
    assert sum(s.metadata["kind"] == "ask" for s in carved) == 2 + 18
    assert carved == validation_scenarios(scen, 0.25, seed=0)
