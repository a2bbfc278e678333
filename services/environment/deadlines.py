"""The deadline of the step (or reset) running on this thread, for the service's own tools that wait on shared
things (the python tool: a sandbox slot, then its program): they stop at it, so that the whole step, all its calls
together, keeps to limits.step_timeout_s and to the client's own deadline."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("step_deadline", default=None)


class StepTimeout(Exception):  # noqa: N818 - named for what the episode ends with (`timeout`)
    """The step's deadline passed inside a tool: the step ends its episode with `timeout`, as a user's environment
    past limits.step_timeout_s does."""


@contextlib.contextmanager
def step_deadline(seconds: float) -> Iterator[None]:
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def current_deadline() -> float | None:
    """The time.monotonic() instant the running step must end by; None outside a step."""
    return _DEADLINE.get()
