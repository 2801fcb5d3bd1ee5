"""Whether an agent's answer was right *because of its tools*: a programmatic reward's check.

A reward that pays any answer containing the expected string pays what the model already
knew (the capital of France) and answers that list every candidate. `check_answer` says
three things of one episode's final answer:

- `right`: the answer names the expected value (whole words, any case) and none of the
  other `candidates` (an answer hedging over several is not right);
- `looked_up`: a tool result of the same episode (a successful call) held the expected
  value;
- `success`: both. `right and not looked_up` is "right without a lookup", worth reporting
  as a rate of its own (recall, or a guess).

Left out: fuzzy matching (numbers written out, synonyms), and judging free text (RULER,
`rewards/ruler.py`, does that).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from art_langgraph.trajectories.trajectory import Trajectory


@dataclass(frozen=True)
class AnswerCheck:
    """What `check_answer` found in one episode."""

    right: bool
    """The answer names the expected value and no other candidate."""
    looked_up: bool
    """A successful tool result of the episode held the expected value."""

    @property
    def success(self) -> bool:
        """Right, and from a lookup: what a tool-using task should pay in full."""
        return self.right and self.looked_up

    @property
    def right_without_lookup(self) -> bool:
        """Right, but no tool result held the value (recall or a guess)."""
        return self.right and not self.looked_up


def mentions(text: str, value: str) -> bool:
    """Whether `text` names `value` as whole words, ignoring case."""
    if not value:
        return False
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text, re.IGNORECASE) is not None


def check_answer(
    answer: str, expected: str, trajectory: Trajectory, candidates: Iterable[str] = ()
) -> AnswerCheck:
    """Check `answer` (the episode's final answer) against `expected`, given the episode's
    tool results and the task's other possible values (`candidates`: the expected one among
    them, or not, is the same)."""
    others = [c for c in candidates if c and c.lower() != expected.lower()]
    right = mentions(answer, expected) and not any(mentions(answer, c) for c in others)
    looked_up = any(
        ev.error is None and mentions(_text(ev.result), expected) for ev in trajectory.tool_events
    )
    return AnswerCheck(right=right, looked_up=looked_up)


def _text(result: object) -> str:
    return result if isinstance(result, str) else json.dumps(result, default=str)
