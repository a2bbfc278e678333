"""When a rollout worker takes new weights: the run's `weight_updates` setting (common/run_spec.py).

- between_batches: at the worker's safe point, between generate calls. A batch started on version v ends on v.
- between_turns: also between the turns of a multi-turn episode (the episode loop calls `at_turn`).
- in_flight: also between the decode steps of a generation. The engine's generating thread asks the receiver at
  every step boundary, and every load takes the lock each decode step holds, so one step never sees two versions;
  the tokens drawn after the swap carry the new version (Sample.versions). The transformers engine runs its own
  decode loop; the vLLM engine steps vLLM's engine itself, one `step()` (a forward of every running request and its
  draws) at a time.
- Calls of the OpenAI endpoint go through the continuous batcher, beside the worker's own batches: outside
  in_flight a load waits for the calls under way, and calls that come while it waits wait for it, so each call's
  tokens are of one version (OneVersionCalls).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from zerobubble.common.config import ConfigError

# Engines that call `between_steps` at step boundaries: every engine kind today; the check stands for the next one.
IN_FLIGHT_ENGINES = ("transformers", "vllm")


def check_engine(mode: str, engine_kind: str) -> None:
    """Refuse, before the engine loads, a mode this engine cannot do."""
    if mode == "in_flight" and engine_kind not in IN_FLIGHT_ENGINES:
        raise ConfigError(f"run.weight_updates: in_flight needs an engine that takes weights between decode steps "
                          f"({', '.join(IN_FLIGHT_ENGINES)}); model.engine is {engine_kind!r}: use "
                          "between_batches or between_turns with it")


class OneVersionCalls:
    """Calls that must each see one version against weight loads: any number of calls at once; a load waits for
    the calls under way, and calls that come while a load waits wait for it (a steady stream of calls does not hold
    a load off)."""

    def __init__(self):
        self._changed = threading.Condition()
        self._calls = 0
        self._loads_waiting = 0

    @contextmanager
    def call(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._loads_waiting)
            self._calls += 1
        try:
            yield
        finally:
            with self._changed:
                self._calls -= 1
                self._changed.notify_all()

    @contextmanager
    def load(self) -> Iterator[None]:
        with self._changed:
            self._loads_waiting += 1
            try:
                self._changed.wait_for(lambda: not self._calls)
            except BaseException:
                self._loads_waiting -= 1
                self._changed.notify_all()
                raise
        try:
            yield
        finally:
            with self._changed:
                self._loads_waiting -= 1
                self._changed.notify_all()


class WeightUpdatePolicy:
    """Wires a run's mode into an engine and a weight receiver; `on_load` is told of every version taken."""

    def __init__(self, mode: str, engine, receiver, on_load: Callable[[], None]):
        self.mode = mode
        self._engine = engine
        self._receiver = receiver
        self._on_load = on_load
        self._in_flight = mode == "in_flight" and receiver is not None
        self._calls = None if mode == "in_flight" else OneVersionCalls()
        if self._in_flight:
            engine.between_steps = self._take

    def _take(self) -> None:
        if self._receiver.apply_to(self._engine):
            self._on_load()

    def call(self) -> AbstractContextManager[None]:
        """Around a call served beside the worker's batches (the OpenAI endpoint's, through the continuous
        batcher): outside in_flight, no weights load while it runs."""
        return nullcontext() if self._calls is None else self._calls.call()

    def loading(self) -> AbstractContextManager[None]:
        """Around a load outside the decode steps (the safe point's, a turn's): waits for the calls under way."""
        return nullcontext() if self._calls is None else self._calls.load()

    def at_turn(self) -> None:
        """Between two turns of an episode: take the newest weights unless the run takes them only between
        batches (the load takes the engine's step lock, so batches playing at once see it between decode steps)."""
        if self.mode != "between_batches" and self._receiver is not None:
            with self.loading():
                self._take()

    @contextmanager
    def one_version(self) -> Iterator[None]:
        """For generation that must see one version throughout (an evaluation scores the weights it names)."""
        if not self._in_flight:
            yield
            return
        self._engine.between_steps = None
        try:
            yield
        finally:
            self._engine.between_steps = self._take
