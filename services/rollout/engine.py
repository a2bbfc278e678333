"""The generation engine contract that rollout workers, eval and the Generate RPC rely on.

Conventions every engine keeps, so a trainer never needs to know which engine produced a sample:

- `Sample.logprobs[t]` is the log-probability of `token_ids[t]` under the distribution it was drawn
  from: logits / temperature, then top-k, then top-p, renormalised. With temperature 0 (greedy) it is
  the log-probability under the raw softmax.
- `Sample.support[t]`, when the engine truncated the distribution (top-k, top-p), is how many tokens that
  distribution kept: always the largest of logits / temperature, so the count names the set (the sampling mask) for
  a trainer that recomputes the log-probs over it. None: the whole vocabulary at every position.
- The EOS token ends a response with finish reason "stop" and is kept as its last token (the trainer
  must see it so that the policy learns to stop); the text leaves special tokens out.
- A stop string ends a response with finish reason "stop". The text ends exactly with the stop string
  (kept, as vLLM's include_stop_str_in_output does); the token ids run up to and including the token
  that completed it, so with multi-character tokens that token may reach a little past the string.
- Reaching `max_new_tokens` gives finish reason "length".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from zerobubble.common.trajectory import FINISH_LENGTH, FINISH_STOP

GREEDY_BELOW = 1e-5


class SamplingError(ValueError):
    """A sampling setting out of range; `field` names it (as in SamplingSettings)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample the responses of one generate call (the same for every prompt in it)."""

    n: int
    temperature: float
    max_new_tokens: int
    top_p: float = 1.0
    top_k: int = -1                       # -1 or 0: off
    stop: tuple[str, ...] = ()
    seed: int | None = None               # None: the engine's own seeded stream

    def __post_init__(self) -> None:
        if self.n < 1:
            raise SamplingError("n", f"n must be >= 1, got {self.n}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise SamplingError("temperature", f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SamplingError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise SamplingError("top_k", f"top_k must be -1, 0 (off) or positive, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise SamplingError("max_new_tokens", f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        empty = [i for i, s in enumerate(self.stop) if not s]
        if empty:
            raise SamplingError(f"stop[{empty[0]}]", "stop strings must not be empty")
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        # vLLM's threshold: below it, dividing by the temperature only overflows.
        return self.temperature < GREEDY_BELOW

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @property
    def truncates(self) -> bool:
        """Whether the distribution sampled from keeps fewer tokens than the vocabulary (top-k or top-p)."""
        return not self.greedy and (self.top_k_enabled or self.top_p < 1.0)


@dataclass
class Sample:
    """One generated response: what an engine call returns for one prompt and sample (the loops make trajectories
    of them, common/trajectory.py)."""

    token_ids: np.ndarray                 # int32 [T]
    logprobs: np.ndarray                  # float32 [T]
    finish_reason: str                    # "stop" | "length"
    text: str = ""
    # int64 [T]: the policy version that drew each token, from engines that take weights mid-sequence; None: the
    # engine's policy_version when the call returned drew them all.
    versions: np.ndarray | None = None
    # int32 [T]: tokens kept by top-k / top-p at each position (0: the whole vocabulary); None: no truncation.
    support: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.token_ids = np.asarray(self.token_ids, dtype=np.int32)
        self.logprobs = np.asarray(self.logprobs, dtype=np.float32)
        if self.token_ids.shape != self.logprobs.shape or self.token_ids.ndim != 1:
            raise ValueError(f"token_ids {self.token_ids.shape} and logprobs {self.logprobs.shape} must be equal 1-D")
        if self.support is not None:
            self.support = np.asarray(self.support, dtype=np.int32)
            if self.support.shape != self.token_ids.shape:
                raise ValueError(f"support {self.support.shape} must match token_ids {self.token_ids.shape}")
            if not self.support.any():
                self.support = None   # 0 everywhere: the whole vocabulary, which None says
        if self.versions is not None:
            self.versions = np.asarray(self.versions, dtype=np.int64)
            if self.versions.shape != self.token_ids.shape:
                raise ValueError(f"versions {self.versions.shape} must match token_ids {self.token_ids.shape}")
        if self.finish_reason not in (FINISH_STOP, FINISH_LENGTH):
            raise ValueError(f"finish_reason must be 'stop' or 'length', got {self.finish_reason!r}")


@runtime_checkable
class Engine(Protocol):
    name: str                             # "transformers" | "vllm"
    policy_version: int
    tokenizer: Any                        # a transformers tokenizer; the chat template lives there

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingSettings) -> list[list[Sample]]:
        """For each prompt (token ids), `sampling.n` samples."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy new weights (checkpoint names) in place and tag later samples with `version`."""
        ...

    def close(self) -> None: ...


class WeightLoadError(ValueError):
    """A weight the engine cannot take: unknown name or wrong shape. The message names it."""


@dataclass
class WeightSpec:
    """The names and shapes an engine accepts in load_weights, with tied aliases (name -> the one it shares)."""

    shapes: Mapping[str, tuple[int, ...]]
    aliases: Mapping[str, str] = field(default_factory=dict)

    def check(self, name: str, tensor: torch.Tensor) -> str:
        """The canonical name this tensor loads into; raises WeightLoadError when it does not fit."""
        target = self.aliases.get(name, name)
        expected = self.shapes.get(target)
        if expected is None:
            near = sorted(n for n in self.shapes if n.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1])[:3]
            hint = f" (similar: {', '.join(near)})" if near else ""
            raise WeightLoadError(f"unknown weight {name!r}{hint}")
        if tuple(tensor.shape) != tuple(expected):
            raise WeightLoadError(f"weight {name!r} has shape {tuple(tensor.shape)}, the model expects {expected}")
        return target

    def check_all(self, weights: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, str, torch.Tensor]]:
        """(given name, canonical name, tensor) for every weight, all checked before any is loaded, so that a
        refused load leaves the model as it was."""
        return [(name, self.check(name, tensor), tensor) for name, tensor in weights]


DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
               "fp16": torch.float16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype, device: torch.device | str) -> torch.dtype:
    """'auto' is bfloat16 on a GPU that supports it and float32 elsewhere (on CPU bf16 buys little speed for the
    small models run there and costs log-prob accuracy); otherwise one of DTYPE_NAMES or a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if torch.device(device).type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; use auto or one of {', '.join(DTYPE_NAMES)}")
    return DTYPE_NAMES[dtype]
