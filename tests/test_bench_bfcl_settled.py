"""bench.probes.bfcl_settled's rule: the token after which BFCL's verdict cannot change."""

from __future__ import annotations

from bench.probes.bfcl_settled import settled_at


class Pieces:
    """A tokenizer whose token i decodes to pieces[i]: the rule reads decoded text only."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


CALL = ["<tool_call>\n", '{"name": "f"}', "\n</tool_call>", "\n"]


def test_a_calling_answer_settles_at_the_call_past_its_count() -> None:
    tok = Pieces(CALL * 3)
    ids = list(range(12))
    assert settled_at(tok, ids, ["f", "f", "f"], expected=1) == 7  # the second call's close
    assert settled_at(tok, ids, ["f", "f", "f"], expected=2) == 11
    assert settled_at(tok, ids, ["f", "f", "f"], expected=3) == 12  # never: the whole answer
    assert settled_at(tok, ids[:6], ["f"], expected=1) == 6  # a second call cut short


def test_irrelevance_settles_at_its_first_call_other_than_decline() -> None:
    tok = Pieces(CALL * 3)
    ids = list(range(12))
    assert settled_at(tok, ids, ["decline", "f", "decline"], expected=None) == 7
    assert settled_at(tok, ids, ["f", "decline", "decline"], expected=None) == 3
    assert settled_at(tok, ids, ["decline"] * 3, expected=None) == 12
