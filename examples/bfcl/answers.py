"""What the BFCL app's answer holds and earns: its `decline` tool, the calls BFCL reads from
it (`calls_of`), how often it declined (`declines_of`), and the partial credit a failed
answer earns (ToolRL's decomposition, `partial_credit`).

BFCL's checker alone decides what passes (`examples/bfcl/checker.py`); this module only
shapes the learning signal around its verdict (`app.Run.reward`). Left out: the graph,
the rollouts and the evaluation (`app.py`).
"""

from __future__ import annotations

import re
import statistics
from typing import Any

from langchain_core.messages import AIMessage

DECLINE = "decline"
"""The graph's extra tool, for a request none of the item's functions can serve: an
answer that calls it alone is no call (`calls_of`), which is how BFCL scores an
irrelevance item's pass."""
DECLINE_TOOL = {
    "type": "function",
    "function": {
        "name": DECLINE,
        "description": "Call this, and no other function, when none of the other functions "
        "can do what the user asks, or the request lacks the values they need.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}
REPEAT_DECLINE_REWARD = 0.9
"""`--decline-reward tiebreak`'s reward for an irrelevance pass by several `decline` calls:
below one decline's 1.0, far above a wrong call's 0. GRPO divides a group's centred
rewards by their spread, so within a group of declines the gap works as a whole one."""


def calls_of(output: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool calls of the graph's answer, as BFCL decodes a function-calling model's:
    `[{name: {arg: value}}]`. An answer that calls only `decline` (once or more) is no
    call; one that calls `decline` beside other functions keeps it as a call, of a function
    the item does not have, so BFCL fails it both ways: as a call where none belonged, and
    as a wrong call where one did (were `decline` dropped, declining beside a call would
    cost a calling item nothing, and the model would learn to hedge)."""
    last = output["messages"][-1]
    if not isinstance(last, AIMessage):
        return []
    calls = [{tc["name"]: dict(tc["args"])} for tc in last.tool_calls]
    return [] if all(DECLINE in c for c in calls) else calls


def declines_of(output: dict[str, Any]) -> int:
    """How many times the graph's answer called `decline` (an irrelevance item passes on
    any number of them, as BFCL scores no call)."""
    last = output["messages"][-1]
    return (
        sum(tc["name"] == DECLINE for tc in last.tool_calls) if isinstance(last, AIMessage) else 0
    )


def _norm(value: Any) -> Any:
    if isinstance(value, str):
        return re.sub(r"[ ,./\-_*^]", "", value).lower().replace("'", '"')
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    return value


def partial_credit(item: dict[str, Any], calls: list[dict[str, Any]]) -> float:
    """ToolRL's decomposition, in [0, 1]: per expected call, the best-matching call's
    right name (0.4), parameter names (0.3, Jaccard over the parameters the answer gives)
    and values (0.3, the share found among BFCL's possible values); averaged over expected
    calls and scaled down by a wrong number of calls. A learning signal only: BFCL's
    checker alone decides what passes."""
    expected = item.get("ground_truth") or []
    if not expected or not calls:
        return 0.0
    scores = []
    unused = list(calls)
    for want in expected:
        ((name, params),) = want.items()
        name = name.replace(".", "_")
        best, best_call = 0.0, None
        for call in unused:
            ((got_name, args),) = call.items()
            if got_name != name:
                continue
            given = {p for p, options in params.items() if "" not in options}
            names = len(given & set(args)) / max(1, len(given | set(args)))
            right = sum(
                p in args and _norm(args[p]) in [_norm(o) for o in options]
                for p, options in params.items()
                if p in args or "" not in options
            )
            values = right / max(1, len([p for p, o in params.items() if p in args or "" not in o]))
            score = 0.4 + 0.3 * names + 0.3 * values
            if score > best:
                best, best_call = score, call
        if best_call is not None:
            unused.remove(best_call)
        scores.append(best)
    count = min(len(calls), len(expected)) / max(len(calls), len(expected))
    return statistics.fmean(scores) * count
