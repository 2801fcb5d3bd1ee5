"""RULER (Relative Universal LLM-Elicited Rewards): an LLM judge scores one group's rollouts.

GRPO only needs rewards that rank the rollouts of one group against each other, so a judge
that sees the whole group at once and scores each rollout relative to the others is a
reward function for any task, with no hand-written scorer. `ruler(message_lists, judge=...)`
returns one `RulerScore` per conversation; `ruler_score_group(group, judge=...)` returns a
copy of a `TrajectoryGroup` rescored that way, and with `functools.partial` it is an
`after_each` for `gather_trajectory_groups`.

The prompt sends the longest common prefix of the conversations once, as `<context>`, then
what each rollout did after it as `<trajectory id="1">` ... `<trajectory id="N">` (messages
as JSON). The judge is any litellm model string ("openai/gpt-4o-mini", or "openai/<name>"
with `base_url` for an OpenAI-compatible server such as our own backend). Its reply is
asked for as a JSON schema (a constrained decoder then cannot produce anything else); a
provider that rejects the schema is asked for a JSON object, then for plain text. Every
reply is checked by `parse_judge_reply`; an invalid one is answered with what was wrong,
up to `max_retries` times.

Left out on purpose: caching of judge calls, judging several groups in one call, pairwise
or tournament judging, and cost tracking (litellm's own callbacks do that). litellm is an
optional dependency, imported on the first call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from textwrap import dedent
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict

from art_langgraph.errors import (
    InfrastructureError,
    ModelBehaviorError,
    UsageError,
)
from art_langgraph.trajectories.trajectory import Trajectory, TrajectoryGroup

logger = logging.getLogger(__name__)

DEFAULT_RUBRIC = dedent(
    """\
    - A trajectory that achieves its goal scores clearly higher than one that does not.
    - Among trajectories that achieve the goal, the more efficient one (fewer wasted steps,
      no unproductive detours or repeated tool calls) scores higher.
    - A wrong, made-up or unsafe answer scores low, lower than an honest partial attempt.
    - Partial progress towards the goal earns partial credit.
    - Scores are relative: a small difference in quality means a small difference in score,
      a large one a large difference. Use the whole range from 0 to 1 when the group allows.
    """
)

# A constrained decoder fills every character it may; the bound makes a weak judge stop.
_EXPLANATION_MAX_CHARS = 200
# Parameters `ruler` sets itself; extra_params may not override them.
_RESERVED = frozenset({"model", "messages", "api_base", "api_key", "base_url"})
# Words in a provider's 400 reply that mean "I do not take this response_format".
_FORMAT_WORDS = ("response_format", "schema", "json_object", "structured")
# What `ruler_score_group(**kw)` passes on to `ruler`.
_RULER_KW = frozenset({"extra_params", "max_retries", "temperature"})
_BACKOFF_S = 0.5  # first wait before retrying a transient failure; doubles each time
_EXCERPT_CHARS = 500
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


class RulerScore(BaseModel):
    """The judge's verdict on one trajectory of a group."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    trajectory_id: str
    """The id the judge saw: "1".."N", the trajectory's 1-based position in the group."""
    explanation: str
    """Why the judge gave this score, in its words ("" when it gave none)."""
    score: float
    """The score, in [0, 1], relative to the other trajectories of the group."""


def _common_prefix_len(message_lists: Sequence[Sequence[dict[str, Any]]]) -> int:
    """Messages every list starts with, capped so no non-empty list is left empty."""
    shortest = min(len(m) for m in message_lists)
    first = message_lists[0]
    n = 0
    while n < shortest - 1 and all(m[n] == first[n] for m in message_lists):
        n += 1
    return n


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _system_prompt(n: int, rubric: str) -> str:
    example = _json(
        {"scores": [{"trajectory_id": "1", "explanation": "...", "score": 0.7}, {"...": "..."}]}
    )
    return (
        f"You are a judge. Below are {n} trajectories of an AI agent that were all given the "
        "same task. The messages they share are shown once in <context> (when they share "
        'any); what each trajectory did after that is in <trajectory id="...">. Messages '
        "are JSON chat messages in OpenAI format; an empty trajectory did nothing more.\n\n"
        "Score each trajectory between 0 and 1, relative to the others, by this rubric:\n"
        f"{rubric.strip()}\n\n"
        "For each trajectory write a short explanation (one or two sentences), then its score. "
        "Answer with JSON only, in this form:\n"
        f"{example}\n"
        f'with exactly one entry for each trajectory id from "1" to "{n}".'
    )


def _check_rubric(rubric: str) -> None:
    if not rubric.strip():
        raise UsageError("the rubric is empty; pass rubric=DEFAULT_RUBRIC or your own text")


def build_judge_messages(
    message_lists: Sequence[Sequence[dict[str, Any]]], rubric: str = DEFAULT_RUBRIC
) -> list[dict[str, Any]]:
    """The judge's chat messages: a system prompt with the rubric, then one user message.

    The user message holds the longest common prefix of `message_lists` once, in
    `<context>` (left out when empty), then each list's remaining messages as JSON in
    `<trajectory id="i">` tags, i = 1..N in order. The prefix never takes a list's last
    message, so identical conversations still show what they ended with.
    """
    if not message_lists:
        raise UsageError("ruler needs at least one conversation to score; got none")
    _check_rubric(rubric)
    prefix = _common_prefix_len(message_lists)
    parts = []
    if prefix:
        parts.append(f"<context>\n{_json(list(message_lists[0][:prefix]))}\n</context>")
    for i, messages in enumerate(message_lists, 1):
        parts.append(f'<trajectory id="{i}">\n{_json(list(messages[prefix:]))}\n</trajectory>')
    return [
        {"role": "system", "content": _system_prompt(len(message_lists), rubric)},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _response_schema(n: int) -> dict[str, Any]:
    """JSON schema of a reply with exactly `n` scores, ids "1".."n" in order."""

    def item(trajectory_id: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "trajectory_id": trajectory_id,
                "explanation": {"type": "string", "maxLength": _EXPLANATION_MAX_CHARS},
                "score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01},
            },
            "required": ["trajectory_id", "explanation", "score"],
            "additionalProperties": False,
        }

    ids = [str(i) for i in range(1, n + 1)]
    scores = {
        "type": "array",
        # prefixItems pins id i to position i, so a constrained decoder cannot repeat an id;
        # providers that ignore it still see the enum and the counts.
        "prefixItems": [item({"type": "string", "const": i}) for i in ids],
        "items": item({"type": "string", "enum": ids}),
        "minItems": n,
        "maxItems": n,
    }
    return {
        "type": "object",
        "properties": {"scores": scores},
        "required": ["scores"],
        "additionalProperties": False,
    }


def _excerpt(text: str) -> str:
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def _load_json(text: str) -> Any:
    """The JSON value in `text`: fenced, bare, or the outermost {...} inside prose."""
    fenced = _FENCE.search(text)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(text)
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    error: ValueError | None = None
    for candidate in candidates:
        try:
            return json.loads(candidate.strip())
        except ValueError as exc:
            error = error or exc
    raise ModelBehaviorError(f"the reply is not valid JSON ({error})")


def parse_judge_reply(text: str | None, n: int) -> list[RulerScore]:
    """Check a judge's reply and return its `n` scores in id order "1".."n".

    Accepts the JSON bare, in a ``` fence, or inside prose; entries in any order; integer
    ids. Scores are clamped to [0, 1]. Raises `ModelBehaviorError` saying what is wrong
    (not JSON, no "scores" list, wrong count, a missing, unknown or repeated id, a score
    that is not a finite number).
    """
    if not text or not text.strip():
        raise ModelBehaviorError("the reply is empty")
    data = _load_json(text)
    entries = data.get("scores") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ModelBehaviorError('the reply has no "scores" list')
    if len(entries) != n:
        raise ModelBehaviorError(f"the reply has {len(entries)} scores; expected exactly {n}")
    wanted = {str(i) for i in range(1, n + 1)}
    by_id: dict[str, RulerScore] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise ModelBehaviorError(f"a score entry is not an object: {_excerpt(_json(entry))}")
        raw_id = entry.get("trajectory_id")
        ok_id = isinstance(raw_id, str | int) and not isinstance(raw_id, bool)
        tid = str(raw_id).strip() if ok_id else None
        if tid not in wanted:
            raise ModelBehaviorError(
                f'unknown trajectory_id {raw_id!r}; the ids are "1" to "{n}", one entry each'
            )
        if tid in by_id:
            raise ModelBehaviorError(f'trajectory_id "{tid}" appears more than once')
        score = entry.get("score")
        if (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
        ):
            raise ModelBehaviorError(
                f'the score of trajectory "{tid}" is {score!r}; it must be a number from 0 to 1'
            )
        explanation = entry.get("explanation", "")
        by_id[tid] = RulerScore(
            trajectory_id=tid,
            explanation=explanation if isinstance(explanation, str) else _json(explanation),
            score=min(1.0, max(0.0, float(score))),
        )
    return [by_id[str(i)] for i in range(1, n + 1)]


def _import_litellm() -> Any:
    try:
        import litellm
    except ImportError as exc:
        raise ImportError(
            "litellm, a dependency of art-langgraph that RULER calls judges through, is "
            "missing: reinstall art-langgraph (pip install art-langgraph)"
        ) from exc
    return litellm


def _formats(litellm: Any, judge: str, base_url: str | None, n: int) -> list[dict[str, Any] | None]:
    """The response formats to try, best first."""
    schema: dict[str, Any] = {
        "type": "json_schema",
        "json_schema": {"name": "ruler_scores", "schema": _response_schema(n)},
    }
    ladder: list[dict[str, Any] | None] = [schema, {"type": "json_object"}, None]
    if base_url is None:  # a hosted model: litellm's model map knows what it supports
        try:
            litellm.get_model_info(judge)
        except Exception:  # not in the map: ask for the schema and fall back on refusal
            return ladder
        if not litellm.supports_response_schema(model=judge):
            return ladder[1:]
    return ladder


def _status(exc: Exception) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def _is_refusal(exc: Exception) -> bool:
    """A 4xx that retrying cannot fix (bad request, key, model name); not 408/409/429.

    Read from the HTTP status, not the class: litellm may wrap a 5xx as BadRequestError
    when the error body says "invalid_request_error".
    """
    status = _status(exc)
    return status is not None and 400 <= status < 500 and status not in (408, 409, 429)


def _rejects_format(exc: Exception) -> bool:
    """A refusal that names the response format (or schema) we asked for."""
    return _is_refusal(exc) and any(w in str(exc).lower() for w in _FORMAT_WORDS)


def _check_params(extra_params: dict[str, Any] | None, max_retries: int) -> None:
    if max_retries < 0:
        raise UsageError(f"max_retries must be >= 0, got {max_retries}")
    if bad := sorted(_RESERVED & set(extra_params or {})):
        raise UsageError(
            f"extra_params may not set {bad}: pass the judge as judge=, the server as "
            "base_url= and the key as api_key="
        )


async def ruler(
    message_lists: Sequence[Sequence[dict[str, Any]]],
    *,
    judge: str,
    rubric: str = DEFAULT_RUBRIC,
    base_url: str | None = None,
    api_key: str | None = None,
    extra_params: dict[str, Any] | None = None,
    max_retries: int = 3,
    temperature: float | None = 0.0,
) -> list[RulerScore]:
    """Score conversations relative to each other with an LLM judge; one score per list, in order.

    Args:
        message_lists: the conversations of one group (OpenAI-format message dicts), which
            should share a task; at least one.
        judge: a litellm model string, e.g. "openai/gpt-4o-mini", or "openai/<served name>"
            with `base_url` for any OpenAI-compatible server.
        rubric: what makes one trajectory better than another; goes into the system prompt.
        base_url: the server's OpenAI base URL (".../v1"); None uses the provider's own.
        api_key: the key for the judge; None lets litellm read the provider's env variable.
        extra_params: more `litellm.acompletion` keywords (max_tokens, timeout,
            reasoning_effort, ...). A `response_format` here is used as given, without the
            fallbacks; model, messages, api_base and api_key are refused. litellm's own
            `max_retries` (the HTTP client's) defaults to 0 here: the retries are `ruler`'s.
        max_retries: how often an invalid reply is answered with what was wrong and asked
            again, and, separately, how often a transient failure (connection, timeout,
            429, 5xx) is retried, after waiting 0.5 s, 1 s, 2 s, ...; 0 means one attempt.
        temperature: the judge's sampling temperature; None does not send it (for models
            that accept only their default).

    Raises:
        ModelBehaviorError: no valid reply after `max_retries` retries (the last reply's
            excerpt is in the message).
        InfrastructureError: the judge could not be reached, after the retries.
        UsageError: bad arguments, or the provider refused the request (key, model name,
            context length).
        ImportError: litellm (a dependency) is missing from this environment.
    """
    _check_params(extra_params, max_retries)
    base = build_judge_messages(message_lists, rubric)
    litellm = _import_litellm()
    n = len(message_lists)
    params = dict(extra_params or {})
    formats = [params.pop("response_format")] if "response_format" in params else None
    formats = formats or _formats(litellm, judge, base_url, n)
    if temperature is not None:
        params["temperature"] = temperature
    params.setdefault("max_retries", 0)  # the retries are ours (below), not the client's too
    messages = base
    invalid = transient = 0
    while True:
        request = dict(params, model=judge, messages=messages, api_base=base_url, api_key=api_key)
        if formats[0] is not None:
            request["response_format"] = formats[0]
        try:
            response = await litellm.acompletion(**request)
        except openai.APIError as exc:  # litellm's exceptions subclass openai's
            if len(formats) > 1 and _rejects_format(exc):
                logger.info("judge %s refused response_format %s: %s", judge, formats[0], exc)
                formats = formats[1:]
                continue
            if _is_refusal(exc):
                raise UsageError(f"the judge {judge!r} refused the request: {exc}") from exc
            if transient >= max_retries:
                where = f" at {base_url}" if base_url else ""
                raise InfrastructureError(
                    f"the judge {judge!r}{where} did not answer ({transient + 1} attempts); "
                    f"last error: {exc}"
                ) from exc
            await asyncio.sleep(_BACKOFF_S * 2**transient)
            transient += 1
            continue
        choice = response.choices[0]
        text = choice.message.content
        try:
            return parse_judge_reply(text, n)
        except ModelBehaviorError as exc:
            problem = str(exc)
            if choice.finish_reason == "length":
                problem += " (the reply was cut off by max_tokens)"
            if invalid >= max_retries:
                raise ModelBehaviorError(
                    f"the judge {judge!r} gave no valid scores in {invalid + 1} replies: "
                    f"{problem}; last reply: {_excerpt(text or '')!r}"
                ) from exc
            invalid += 1
            feedback = (
                f"Your reply was not valid: {problem}. Answer again with JSON only: "
                f'{{"scores": [...]}} with exactly {n} entries, trajectory ids "1" to "{n}", '
                "each with an explanation and a score from 0 to 1."
            )
            messages = [
                *base,
                {"role": "assistant", "content": text or ""},
                {"role": "user", "content": feedback},
            ]


async def ruler_score_group(
    group: TrajectoryGroup,
    *,
    judge: str,
    rubric: str = DEFAULT_RUBRIC,
    base_url: str | None = None,
    api_key: str | None = None,
    swallow_exceptions: bool = False,
    nodes: Sequence[str] | None = None,
    node_rubrics: Mapping[str, str] | None = None,
    **kw: Any,
) -> TrajectoryGroup | None:
    """A copy of `group` whose rewards are the judge's scores (see `ruler` for the arguments).

    Each trajectory of the copy gets `reward` = the score, `metrics["ruler_score"]` = the
    score, `metrics["independent_reward"]` = its reward before, and a "RULER: <explanation>"
    line in `logs`; `group` itself is not changed. A group of fewer than 2 trajectories is
    returned as it is (there is nothing to compare). With `swallow_exceptions`, a judge
    failure is logged as a warning and returns None, which drops the group when this is
    the `after_each` of `gather_trajectory_groups`:

        after_each=functools.partial(ruler_score_group, judge="openai/gpt-4o-mini",
                                     swallow_exceptions=True)

    `**kw` goes to `ruler` (extra_params, max_retries, temperature). Bad arguments raise
    even with `swallow_exceptions`.

    Per node: with `nodes` (LangGraph node names), each named node is also judged on its
    own, in one judge call per node: what each trajectory's node saw and did (its last
    call there, `node_conversation`), against the other trajectories' same node, with
    `node_rubrics[node]` if given, else `rubric`. The score becomes
    `node_rewards[node]` (and `metrics["ruler_score/<node>"]`), so the trainer computes
    that node's advantages from it (`training.prepare.node_advantages`). A trajectory in
    which the node made no call is left out of that node's judging; a node that ran in
    fewer than 2 trajectories is not judged. `reward` is still judged on the whole run.
    """
    if group.pending:
        raise UsageError("this TrajectoryGroup has pending rollouts; resolve or gather it first")
    if unknown := sorted(set(kw) - _RULER_KW):
        raise TypeError(f"ruler_score_group() got unexpected keyword arguments {unknown}")
    _check_params(kw.get("extra_params"), kw.get("max_retries", 3))
    _check_rubric(rubric)
    if unknown := sorted(set(node_rubrics or {}) - set(nodes or [])):
        raise UsageError(f"node_rubrics names nodes that nodes= does not: {unknown}")
    for node_rubric in (node_rubrics or {}).values():
        _check_rubric(node_rubric)
    if len(group.trajectories) < 2:
        return group
    judged: dict[str, tuple[list[int], list[RulerScore]]] = {}
    try:
        scores = await ruler(
            [t.messages for t in group.trajectories],
            judge=judge,
            rubric=rubric,
            base_url=base_url,
            api_key=api_key,
            **kw,
        )
        for node in nodes or []:
            seen = [(i, node_conversation(t, node)) for i, t in enumerate(group.trajectories)]
            ran = [(i, conv) for i, conv in seen if conv]
            if len(ran) < 2:
                continue
            judged[node] = (
                [i for i, _ in ran],
                await ruler(
                    [conv for _, conv in ran],
                    judge=judge,
                    rubric=(node_rubrics or {}).get(node, rubric),
                    base_url=base_url,
                    api_key=api_key,
                    **kw,
                ),
            )
    except Exception as exc:
        if not swallow_exceptions:
            raise
        logger.warning(
            "RULER: judge %s failed on a group of %d trajectories; dropping the group: %s",
            judge,
            len(group.trajectories),
            exc,
        )
        return None
    scored = group.model_copy(deep=True)
    for trajectory, score in zip(scored.trajectories, scores, strict=True):
        trajectory.metrics["independent_reward"] = trajectory.reward
        trajectory.metrics["ruler_score"] = score.score
        trajectory.reward = score.score
        trajectory.log(f"RULER: {score.explanation}")
    for node, (indices, node_scores) in judged.items():
        for i, score in zip(indices, node_scores, strict=True):
            trajectory = scored.trajectories[i]
            trajectory.node_rewards = {**trajectory.node_rewards, node: score.score}
            trajectory.metrics[f"ruler_score/{node}"] = score.score
            trajectory.log(f"RULER ({node}): {score.explanation}")
    return scored


def node_conversation(trajectory: Trajectory, node: str) -> list[dict[str, Any]]:
    """What `node` saw and did in a trajectory: the request and reply of its last call
    there (a call is the node's when `node` is its node or in its namespace); empty when
    the node made no call. An agent node's last request holds its earlier turns."""
    calls = [c for c in trajectory.calls if c.node == node or node in c.namespace]
    return calls[-1].to_messages() if calls else []
