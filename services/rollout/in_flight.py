"""When a rollout worker takes new weights: the run's `weight_updates` setting (common/run_spec.py).

- between_batches: at the worker's safe point, between generate calls. A batch started on version v ends on v.
- between_turns: also between the turns of a multi-turn episode (the episode loop calls `at_turn`).
- in_flight: also between the decode steps of a generation. The engine's generating thread asks the receiver at
  every step boundary, and every load takes the lock each decode step holds, so one step never sees two versions;
  the tokens drawn after the swap carry the new version (Sample.versions). The transformers engine runs its own
  decode loop; the vLLM engine steps vLLM's engine itself, one `step()` (a forward of every running request and its
  draws) at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from zerobubble.common.config import ConfigError

# Engines that call `between_steps` at step boundaries: every engine kind today; the check stands for the next one.
IN_FLIGHT_ENGINES = ("transformers", "vllm")


def check_engine(mode: str, engine_kind: str) -> None:
    """Refuse, before the engine loads, a mode this engine cannot do."""
    if mode == "in_flight" and engine_kind not in IN_FLIGHT_ENGINES:
        raise ConfigError(f"run.weight_updates: in_flight needs an engine that takes weights between decode steps "
                          f"({', '.join(IN_FLIGHT_ENGINES)}); model.engine is {engine_kind!r}: use "
                          "between_batches or between_turns with it")


class WeightUpdatePolicy:
    """Wires a run's mode into an engine and a weight receiver; `on_load` is told of every version taken."""

    def __init__(self, mode: str, engine, receiver, on_load: Callable[[], None]):
        self.mode = mode
        self._engine = engine
        self._receiver = receiver
        self._on_load = on_load
        self._in_flight = mode == "in_flight" and receiver is not None
        if self._in_flight:
            engine.between_steps = self._take

    def _take(self) -> None:
        if self._receiver.apply_to(self._engine):
            self._on_load()

    def at_turn(self) -> None:
        """Between two turns of an episode: take the newest weights unless the run takes them only between
        batches (the load takes the engine's step lock, so batches playing at once see it between decode steps)."""
        if self.mode != "between_batches" and self._receiver is not None:
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
