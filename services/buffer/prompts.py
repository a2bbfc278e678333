"""Training prompts: the data set, read and checked once at start (services/common/data.py), and a seeded order
per epoch."""

from __future__ import annotations

import numpy as np

from zerobubble.buffer.config import PromptsConfig
from zerobubble.common.data import DataError, DataSet, PromptRow, load_data

# The buffer's older name for it, also raised for a write-ahead log of another prompt set.
PromptFileError = DataError
__all__ = ["PromptFileError", "PromptRow", "PromptSource"]


class PromptSource:
    """All prompts of the training set, addressed by position (`rows`) or by prompt id (`index_of`)."""

    def __init__(self, rows: DataSet, *, seed: int = 0, shuffle: bool = True):
        self.rows = rows
        self.index_of = rows.index_of
        self.seed = seed
        self.shuffle = shuffle

    @classmethod
    def from_config(cls, config: PromptsConfig) -> PromptSource:
        return cls(load_data(config, field="prompts", default_split="train"), seed=config.seed,
                   shuffle=config.shuffle)

    @classmethod
    def load(cls, path, *, seed: int = 0, shuffle: bool = True) -> PromptSource:
        return cls.from_config(PromptsConfig(path=path, seed=seed, shuffle=shuffle))

    @property
    def fingerprint(self) -> str:
        """Names the prompt set: a log written for other prompts must not be replayed against these."""
        return self.rows.fingerprint

    def __len__(self) -> int:
        return len(self.rows)

    def order(self, epoch: int) -> np.ndarray:
        """Positions of the prompts in the order epoch `epoch` hands them out (the same after a restart)."""
        if not self.shuffle:
            return np.arange(len(self.rows))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
