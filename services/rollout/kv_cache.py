"""The KV caches of the continuous batcher (rollout/continuous.py): the batch's, which grows in place, and the
caches kept for a key's next request, within a bound on the tokens they hold."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]   # per layer: keys and values [batch, heads, positions, head_dim]


@dataclass
class Kept:
    """A finished request's cache: the ids it holds keys and values of, and those keys and values."""

    ids: list[int]
    kv: KV


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class KeptCaches:
    """Finished requests' KV caches under their keys, for each key's next request; the least recently kept go first
    when the tokens they hold pass `max_tokens`."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[Hashable, Kept] = OrderedDict()
        self.tokens = 0
        self.bytes = 0
        self.evictions = 0
        self.peak_bytes = 0       # the most held at once, and how many entries held it
        self.peak_entries = 0

    def put(self, key: Hashable, kept: Kept) -> None:
        self.take(key)
        if len(kept.ids) > self.max_tokens:
            return
        self._entries[key] = kept
        self._count(kept, +1)
        while self.tokens > self.max_tokens:
            _, oldest = self._entries.popitem(last=False)
            self._count(oldest, -1)
            self.evictions += 1
        if self.bytes > self.peak_bytes:
            self.peak_bytes, self.peak_entries = self.bytes, len(self._entries)

    def take(self, key: Hashable) -> Kept | None:
        kept = self._entries.pop(key, None)
        if kept is not None:
            self._count(kept, -1)
        return kept

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _count(self, kept: Kept, sign: int) -> None:
        self.tokens += sign * len(kept.ids)
        self.bytes += sign * sum(k.nbytes + v.nbytes for k, v in kept.kv)


def left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """[batch, heads, positions, head_dim] with zeros before the positions, up to `width`."""
    return F.pad(tensor, (0, 0, width - tensor.shape[-2], 0))


class GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values are written into spare room at each step: HF's DynamicLayer copies the
    whole cache at every step (torch.cat), and with many long episodes in a batch that copy is a step's cost."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.hold(keys, values)

    def hold(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Take these keys and values (every row and position) into a fresh buffer with room to grow."""
        length = keys.shape[-2]
        room = length + max(64, length // 2)
        self._keys = keys.new_empty((*keys.shape[:2], room, keys.shape[3]))
        self._values = values.new_empty((*values.shape[:2], room, values.shape[3]))
        self._keys[:, :, :length] = keys
        self._values[:, :, :length] = values
        self._length = length
        self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            self.hold(torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2))
        else:
            self._keys[:, :, self._length:end] = key_states
            self._values[:, :, self._length:end] = value_states
            self._length = end
            self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values
