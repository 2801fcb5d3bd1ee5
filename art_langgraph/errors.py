"""The exception tree of art_langgraph.

One root (`ArtError`), then three branches: the caller's misuse (`UsageError`), the
model's misbehaviour (`ModelBehaviorError`), and infrastructure failure
(`InfrastructureError`). Each carries structured fields where a caller may want to
branch on them. A missing optional dependency raises `MissingExtraError`, an
ImportError that names the extra to install.

Left out: HTTP status mapping, which lives in the server (`serving/app.py`).
"""

from __future__ import annotations


class ArtError(Exception):
    """Root of every error this package raises on purpose."""


class UsageError(ArtError, ValueError):
    """The caller asked for something invalid (bad argument, bad request, bad record)."""


class ModelBehaviorError(ArtError):
    """The model produced something the caller cannot use (e.g. malformed output)."""


class InfrastructureError(ArtError, RuntimeError):
    """A server, engine or file system failed underneath a valid request."""


class CheckpointError(InfrastructureError):
    """A checkpoint on disk is corrupt or holds non-finite numbers, or a step would write one."""

    def __init__(self, path: object, detail: str) -> None:
        self.path = str(path)
        self.detail = detail
        super().__init__(f"checkpoint {self.path}: {detail}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # pickles: a trainer rank sends it
        return (type(self), (self.path, self.detail))


class TrainerRankError(InfrastructureError):
    """A rank of a data-parallel trainer died or failed; the whole step failed with it."""

    def __init__(self, rank: int, op: str, exit_code: int | None, detail: str = "") -> None:
        self.rank = rank
        self.op = op
        self.exit_code = exit_code
        self.detail = detail
        how = "failed" if exit_code is None else f"exited with code {exit_code}"
        super().__init__(
            f"trainer rank {rank} {how} during {op}{': ' + detail if detail else ''}; every "
            "rank was stopped and nothing of the step was applied (a backend builds a new "
            "trainer from the latest checkpoint at the next step)"
        )

    def __reduce__(self) -> tuple[type, tuple[int, str, int | None, str]]:
        return (type(self), (self.rank, self.op, self.exit_code, self.detail))


class NonFiniteRewardError(UsageError):
    """A trajectory's reward is NaN, infinite or not a number."""

    def __init__(self, trajectory_id: str, reward: object) -> None:
        self.trajectory_id = trajectory_id
        self.reward = reward
        super().__init__(
            f"trajectory {trajectory_id!r} has a non-finite reward ({reward!r}); "
            "set trajectory.reward to a finite float"
        )


class ContextLengthError(UsageError):
    """A prompt (plus the requested completion) does not fit the model's context."""

    def __init__(self, prompt_tokens: int, max_tokens: int | None, context_length: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length
        if max_tokens is None:
            detail = f"the prompt has {prompt_tokens} tokens"
        else:
            detail = (
                f"you requested {prompt_tokens + max_tokens} tokens "
                f"({prompt_tokens} in the prompt, {max_tokens} for the completion)"
            )
        super().__init__(
            f"this model's maximum context length is {context_length} tokens, but {detail}"
        )


class UnknownModelError(UsageError):
    """A request named a model or adapter step that is not served."""

    def __init__(self, model: str, available: list[str]) -> None:
        self.model = model
        self.available = available
        super().__init__(f"model {model!r} is not served here; available: {sorted(available)}")


class NotRegisteredError(UsageError):
    """A backend was asked about a model it does not hold (never registered, or restarted)."""


class MissingExtraError(ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            f"{module!r} is not installed; install it with: pip install 'art-langgraph[{extra}]'"
        )
