"""Constrained decoding with llguidance: JSON schemas and forced tool calls.

`GrammarCompiler` turns a JSON schema (for `response_format`) or a set of tools (for
`tool_choice="required"` or a named function) into an llguidance grammar string, and
makes a fresh `LLMatcher` per request. Whitespace in JSON is not flexible: a random
or weak model given the freedom pads forever.

The engine asks each matcher for the allowed-token bitmask before it samples, and
feeds it the sampled token after. `forced_run` reads ahead the tokens a grammar allows
alone (a tool call's `{"name": "`, the rest of a function name once its prefix is unique),
which the engine then feeds in one forward instead of one step each (`TorchEngineConfig.
fast_forward`); `walk` checks and rolls back the tokens a speculative step guesses
(`engine/speculative.py`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import torch

from art_langgraph.errors import UsageError

_JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarCompiler:
    """Compiles grammars for one tokenizer and makes matchers."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int) -> None:
        import llguidance.hf

        # Imported here, on the thread that builds the engine, and not first on the worker:
        # it imports torch's functorch, and a first import of that on the worker while the
        # caller's thread imports other parts of torch (a trainer, peft) met half-made
        # modules ("grammar warm-up failed": torch.ops.streams had no record_event).
        import llguidance.torch

        self.ll_tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size)
        self.vocab_size = vocab_size
        added = set(hf_tokenizer.get_added_vocab())
        # Where the tool-call markers are single tokens (Qwen2.5, the tiny preset), the
        # grammar names those tokens, so a forced call samples the ids `encode` gives.
        self._open = '<tool_call> "\\n"' if "<tool_call>" in added else json.dumps("<tool_call>\n")
        self._close = (
            '"\\n" </tool_call>' if "</tool_call>" in added else json.dumps("\n</tool_call>")
        )

    def json_schema(self, schema: dict[str, Any]) -> str:
        """A grammar for one JSON value matching `schema`."""
        import llguidance

        return self._checked(
            llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_DEFAULTS)  # type: ignore[arg-type]
        )

    def json_object(self) -> str:
        """A grammar for any JSON object (`response_format={"type": "json_object"}`)."""
        return self.json_schema({"type": "object"})

    def tool_calls(self, tools: list[dict[str, Any]], *, parallel: bool = True) -> str:
        """A grammar for one (or, with `parallel`, several) `<tool_call>{json}</tool_call>` blocks.

        Each block's JSON is `{"name": <one of the tools>, "arguments": <its parameters>}`.
        """
        import llguidance

        if not tools:
            raise UsageError("a forced tool call needs at least one tool")
        options = []
        for tool in tools:
            fn = tool.get("function", tool)
            params = dict(fn.get("parameters") or {"type": "object"})
            # Arguments are the declared properties: without this a weak model may invent
            # keys forever (JSON Schema allows extra properties by default).
            params.setdefault("additionalProperties", False)
            options.append(
                {
                    "type": "object",
                    "properties": {"name": {"const": fn["name"]}, "arguments": params},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
            )
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        schema = {**schema, "x-guidance": _JSON_DEFAULTS}
        rep = ' ("\\n" call)*' if parallel else ""
        lark = f"start: call{rep}\ncall: {self._open} body {self._close}\nbody: %json {json.dumps(schema)}\n"
        return self._checked(llguidance.LLMatcher.grammar_from_lark(lark))

    def structured(self, spec: dict[str, Any]) -> str:
        """vLLM's `structured_outputs`: one of json (a schema), regex, grammar (Lark), choice."""
        import llguidance

        if (schema := spec.get("json")) is not None:
            return self.json_schema(schema if isinstance(schema, dict) else json.loads(schema))
        if (regex := spec.get("regex")) is not None:
            return self._checked(llguidance.LLMatcher.grammar_from_regex(str(regex)))
        if (lark := spec.get("grammar")) is not None:
            return self._checked(llguidance.LLMatcher.grammar_from_lark(str(lark)))
        choices = spec.get("choice") or []
        if not choices or not all(isinstance(c, str) for c in choices):
            raise UsageError("structured_outputs.choice must be a non-empty list of strings")
        lark = "start: " + " | ".join(json.dumps(c) for c in choices) + "\n"
        return self._checked(llguidance.LLMatcher.grammar_from_lark(lark))

    def matcher(self, grammar: str) -> Any:
        """A fresh matcher for one request."""
        import llguidance

        m = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=1)
        if m.is_error():
            raise UsageError(f"invalid grammar: {m.get_error()}")
        return m

    def _checked(self, grammar: str) -> str:
        import llguidance

        ok, is_error, messages = _validate(llguidance, self.ll_tokenizer, grammar)
        if not ok or is_error:
            raise UsageError(f"cannot compile the constraint: {'; '.join(messages)}")
        return grammar

    def warm_up(self) -> None:
        """Pay llguidance's one-time per-tokenizer set-up (~1 s) before the first request does."""
        import llguidance.torch

        m = self.matcher(self.json_object())
        llguidance.torch.fill_next_token_bitmask(m, self.allocate_bitmask(1), 0)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        import llguidance.torch

        return llguidance.torch.allocate_token_bitmask(rows, self.vocab_size)

    def forced_run(
        self, matcher: Any, limit: int, refuse: frozenset[int]
    ) -> tuple[list[int], torch.Tensor | None]:
        """The tokens `matcher` allows one at a time, each the only token its mask allows,
        consumed as they are read; at most `limit`, and none in `refuse` (the end of text:
        the engine samples those, as it would anyway). Sampling each of them one step at a
        time would draw the same token: what a fast-forward skips is the step, not a choice.
        Also returns the packed mask (1, W) of the matcher's state after the run, where the
        read computed it (the run ended on a token it does not force), so the sampler that
        picks the next token reuses it instead of computing it again (`mask_logits`)."""
        import llguidance.torch

        run: list[int] = []
        if limit <= 0 or matcher.is_stopped():
            return run, None
        bitmask = self._one_row
        while len(run) < limit:
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
            token = only_token(bitmask[0])
            if token is None or token in refuse or token >= self.vocab_size:
                return run, bitmask.clone()
            if not matcher.consume_token(token):  # never expected: it was the only one allowed
                break
            run.append(token)
            if matcher.is_stopped():
                break
        return run, None

    def walk(
        self, matcher: Any, tokens: list[int], ready: torch.Tensor | None
    ) -> tuple[list[int], list[torch.Tensor]]:
        """The longest prefix of `tokens` that `matcher` allows, and the packed mask (1, W)
        of each state along it: before each kept token and after the last (`ready`: the
        mask of its state now, where already computed). The matcher ends where it began
        (speculative tokens, `engine/speculative.py`)."""
        import llguidance.torch

        kept: list[int] = []
        bitmask = self.allocate_bitmask(len(tokens) + 1)
        for j in range(len(tokens) + 1):
            if j == 0 and ready is not None:
                bitmask[0] = ready[0]
            else:
                llguidance.torch.fill_next_token_bitmask(matcher, bitmask, j)
            if j == len(tokens) or matcher.is_stopped():
                break
            t = tokens[j]
            allowed = t < self.vocab_size and (int(bitmask[j, t >> 5]) >> (t & 31)) & 1
            if not allowed or not matcher.consume_token(t):
                break
            kept.append(t)
        if kept and not matcher.rollback(len(kept)):
            raise RuntimeError(f"grammar could not roll back: {matcher.get_error()}")
        return kept, list(bitmask[: len(kept) + 1].split(1))

    @functools.cached_property
    def _one_row(self) -> torch.Tensor:
        return self.allocate_bitmask(1)

    @staticmethod
    def mask_logits(
        logits: torch.Tensor,
        matchers: list[tuple[int, Any, torch.Tensor | None]],
        bitmask: torch.Tensor,
    ) -> None:
        """In place: forbid, in each listed row of logits (B, V), the tokens its matcher
        rejects: (row, matcher, its packed mask where already computed for its state now)."""
        import llguidance.torch

        for j, (_row, m, ready) in enumerate(matchers):
            if ready is not None:
                bitmask[j] = ready[0]
            else:
                llguidance.torch.fill_next_token_bitmask(m, bitmask, j)
        # Not llguidance's apply_token_bitmask_inplace: it is torch.compile'd, which costs
        # seconds on first use and recompiles for every new number of rows.
        allowed = unpack_bitmask(bitmask[: len(matchers)], logits.shape[-1]).to(
            logits.device
        )  # (k, V)
        rows = torch.tensor([r for r, _, _ in matchers], device=logits.device)
        logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


_BITS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """llguidance's packed mask (k, ceil(V/32)) int32 -> allowed (k, V) bool; bit j of word w is token 32w+j."""
    k, words = bitmask.shape
    bits = (bitmask.unsqueeze(-1) >> _BITS) & 1  # (k, W, 32)
    return bits.bool().reshape(k, words * 32)[:, :vocab_size]


def only_token(words: torch.Tensor) -> int | None:
    """The token of a packed mask row (ceil(V/32),) int32 when it allows exactly one, else None."""
    nonzero = words.nonzero()
    if nonzero.numel() != 1:
        return None
    w = int(nonzero[0, 0])
    bits = int(words[w]) & 0xFFFFFFFF
    if bits & (bits - 1):
        return None
    return 32 * w + bits.bit_length() - 1


def _validate(llguidance: Any, tokenizer: Any, grammar: str) -> tuple[bool, bool, list[str]]:
    m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if m.is_error():
        return False, True, [m.get_error()]
    return True, False, []
