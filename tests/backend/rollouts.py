"""A minimal rollout through the real server, shared by the backend tests and their subprocesses."""

from __future__ import annotations

import re
from typing import Any

import art_langgraph as art

NUMBER_WORDS = frozenset("one two three four five six seven eight nine ten".split())


def says_a_number_word(text: str) -> float:
    """Toy reward: 1.0 if the reply contains a number word (one..ten), else 0.0."""
    return 1.0 if any(w in NUMBER_WORDS for w in re.findall(r"[a-z]+", text.lower())) else 0.0


async def rollout(
    model: art.Model,
    prompt: str,
    *,
    step: int | None = None,
    max_tokens: int = 8,
    seed: int | None = None,
) -> art.Trajectory:
    client = model.openai_client(max_retries=0)
    kw: dict[str, Any] = {
        "model": model.inference_name(step),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "logprobs": True,
        "extra_body": {"return_token_ids": True},
    }
    if seed is not None:
        kw["seed"] = seed
    r = await client.chat.completions.create(**kw)
    call = art.LLMCall.from_openai(kw, r)
    text = r.choices[0].message.content or ""
    return art.Trajectory(
        messages=call.to_messages(), calls=[call], reward=says_a_number_word(text)
    )
