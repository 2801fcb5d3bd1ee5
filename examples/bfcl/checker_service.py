"""BFCL's own data and AST checker, served over stdin/stdout from BFCL's environment.

Runs with `.venv-bfcl/bin/python` (made by scripts/setup-bfcl.sh), never in the project's
environment: `bfcl-eval` pins numpy, networkx and a dozen model SDKs that would fight
ours, and its checker imports every model handler. `examples/bfcl/checker.py` starts it
as a child and speaks one JSON object per line each way:

- `{"op": "items", "category": "simple_python"}` -> `{"items": [...]}`: BFCL v4's items of
  that category, each with its `ground_truth` from BFCL's possible answers (none for
  irrelevance) and its `tools`: its functions as OpenAI tools, by BFCL's own
  `convert_to_tool` for OpenAI chat completions (BFCL's types to JSON Schema, dots in
  names to underscores);
  simple_java and simple_javascript (scored whole, never split or trained on) are served
  as BFCL serves them to a function-calling model: their tools from the docs with BFCL's
  language hint (every parameter a string holding a Java or JavaScript literal), their
  `function` unhinted, as the checker reads it;
- `{"op": "check", "category": ..., "function": [...], "ground_truth": [...], "output":
  [{name: {arg: value}}, ...]}` -> BFCL's verdict `{"valid": bool, "error": [...],
  "error_type": ...}`, computed the way BFCL's eval runner does for a function-calling
  model: an output that is not a list of one-key dicts is `ast_decoder:decoder_wrong_output_format`;
  irrelevance passes when the output holds no call (`is_empty_output`); every other
  category goes to `ast_checker` with `MODEL_NAME` and the category's language;
- `{"op": "overall", "scores": {category: {"accuracy": a, "total_count": n}}}` ->
  `{"simple": ..., "non_live": ...}`: BFCL's own `calculate_unweighted_accuracy`, as its
  leaderboard computes "Non-Live Overall Acc": the unweighted mean of simple (itself the
  mean of simple_python, simple_java and simple_javascript), multiple, parallel and
  parallel_multiple. Irrelevance is its own column there, outside that mean.

`MODEL_NAME` is BFCL's entry for GPT-4o-mini in function-calling mode. Its naming rule
(`underscore_to_dot=True`) matches how the example names tools: BFCL's `convert_to_tool`
for OpenAI-style models turns `math.factorial` into `math_factorial`, and the checker then
expects the underscore form. Nothing else of that entry is used.

It exits at end of input, so it never outlives the process that started it. Left out:
the live, multi-turn, memory, web-search and format-sensitivity categories (kept out of
training, evaluation and every choice, as a transfer test) and BFCL's executable checks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bfcl_eval.constants.enums import Language, ModelStyle
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
from bfcl_eval.eval_checker.eval_runner_helper import calculate_unweighted_accuracy
from bfcl_eval.model_handler.utils import convert_to_tool
from bfcl_eval.utils import is_empty_output, is_function_calling_format_output, load_dataset_entry

MODEL_NAME = "gpt-4o-mini-2024-07-18-FC"
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
WHOLE_ONLY = ("simple_java", "simple_javascript")
LANGUAGE = {"simple_java": Language.JAVA, "simple_javascript": Language.JAVASCRIPT}
_DATA = Path(sys.modules["bfcl_eval"].__file__).parent / "data"  # type: ignore[arg-type]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def items(category: str) -> list[dict]:
    if category not in CATEGORIES + WHOLE_ONLY:
        raise ValueError(f"category {category!r} is not one of {CATEGORIES + WHOLE_ONLY}")
    out = _jsonl(_DATA / f"BFCL_v4_{category}.json")
    answers = _DATA / "possible_answer" / f"BFCL_v4_{category}.json"
    truth = {a["id"]: a["ground_truth"] for a in _jsonl(answers)} if answers.is_file() else {}
    hinted = {}
    if category in LANGUAGE:  # the docs BFCL shows a model: its language hint applied
        entries = load_dataset_entry(category, include_language_specific_hint=True)
        hinted = {e["id"]: e["function"] for e in entries}
    for item in out:
        if item["id"] in truth:
            item["ground_truth"] = truth[item["id"]]
        item["tools"] = convert_to_tool(
            hinted.get(item["id"], item["function"]),
            GORILLA_TO_OPENAPI,
            ModelStyle.OPENAI_COMPLETIONS,
        )
    return out


def check(category: str, function: list, ground_truth: list | None, output: object) -> dict:
    if category == "irrelevance":
        if is_empty_output(output):
            return {"valid": True}
        return {
            "valid": False,
            "error": ["Valid syntax. Successfully decode AST when it should not."],
            "error_type": "irrelevance_error:decoder_success",
        }
    if not is_function_calling_format_output(output):
        return {
            "valid": False,
            "error": [
                "Did not output in the specified format. Note: the model_result is wrapped in a string to ensure json serializability."
            ],
            "error_type": "ast_decoder:decoder_wrong_output_format",
        }
    language = LANGUAGE.get(category, Language.PYTHON)
    return ast_checker(function, output, ground_truth, language, category, MODEL_NAME)


def overall(scores: dict[str, dict]) -> dict:
    """BFCL's non-live overall from per-category accuracies (its leaderboard's arithmetic)."""

    def entry(category: str) -> dict:
        s = scores[category]
        return {
            "accuracy": s["accuracy"],
            "total_count": s["total_count"],
            "display_accuracy": s["accuracy"],
        }

    simple = calculate_unweighted_accuracy([entry(c) for c in ("simple_python", *WHOLE_ONLY)])
    non_live = calculate_unweighted_accuracy(
        [simple, *(entry(c) for c in ("multiple", "parallel", "parallel_multiple"))],
        display_na_if_category_missing=False,
    )
    return {"simple": simple["accuracy"], "non_live": non_live["accuracy"]}


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if req["op"] == "items":
                reply: dict = {"items": items(req["category"])}
            elif req["op"] == "overall":
                reply = overall(req["scores"])
            elif req["op"] == "check":
                reply = check(
                    req["category"], req["function"], req.get("ground_truth"), req["output"]
                )
            else:
                raise ValueError(f"unknown op {req['op']!r}")
        except Exception as exc:  # reported to the caller, who raises it
            reply = {"failure": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
