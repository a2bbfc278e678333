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


class BatchLayer(DynamicLayer):
    """One layer's keys and values of the running batch, right-aligned (left padding), in buffers with spare rows
    and spare positions on both sides, so that nothing but what changes is copied: a decode step writes its column
    into the room on the right (HF's DynamicLayer copies the whole cache at every step), a request joining writes
    its own rows (widening the batch into the room on the left), one leaving has the last row moved into its
    place, and positions no row uses any more are dropped from the left. Only a buffer out of room is copied whole.
    Positions a row does not use hold zeros: the attention mask gives them no weight, and a zero weight on a finite
    value adds nothing."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.lazy_initialization(keys, values)
        self._k = self._v = keys.new_zeros((0, keys.shape[1], 0, keys.shape[3]))
        self._rows = self._start = self._end = 0
        self.add_rows(keys, values)

    @property
    def width(self) -> int:
        return self._end - self._start

    def _regrow(self, rows: int, left: int, right: int) -> None:
        """Fresh buffers for at least `rows` rows, `left` free positions before the live ones and `right` after."""
        width = self.width
        heads, dim = self._k.shape[1], self._k.shape[3]
        margin = max(64, width // 2)
        row_room = max(self._k.shape[0], rows + max(8, rows // 2))
        keys = self._k.new_zeros((row_room, heads, max(left, margin) + width + max(right, margin), dim))
        values = torch.zeros_like(keys)
        start = max(left, margin)
        keys[:self._rows, :, start:start + width] = self._k[:self._rows, :, self._start:self._end]
        values[:self._rows, :, start:start + width] = self._v[:self._rows, :, self._start:self._end]
        self._k, self._v, self._start, self._end = keys, values, start, start + width

    def _views(self) -> None:
        self.keys = self._k[:self._rows, :, self._start:self._end]
        self.values = self._v[:self._rows, :, self._start:self._end]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step's positions, one column per row on the right."""
        added = key_states.shape[-2]
        if self._end + added > self._k.shape[2]:
            self._regrow(self._rows, 0, added)
        self._k[:self._rows, :, self._end:self._end + added] = key_states
        self._v[:self._rows, :, self._end:self._end + added] = value_states
        self._end += added
        self._views()
        return self.keys, self.values

    def add_rows(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Rows right-aligned at their own width; the batch widens to the left when theirs is wider."""
        count, width = keys.shape[0], keys.shape[-2]
        if width > self.width:
            grow = width - self.width
            if self._start < grow:
                self._regrow(self._rows, grow, 0)
            # The room on the left may hold what dropped rows left there.
            self._k[:self._rows, :, self._start - grow:self._start] = 0
            self._v[:self._rows, :, self._start - grow:self._start] = 0
            self._start -= grow
        if self._rows + count > self._k.shape[0]:
            self._regrow(self._rows + count, 0, 0)
        rows = slice(self._rows, self._rows + count)
        self._k[rows, :, self._start:self._end - width] = 0
        self._v[rows, :, self._start:self._end - width] = 0
        self._k[rows, :, self._end - width:self._end] = keys
        self._v[rows, :, self._end - width:self._end] = values
        self._rows += count
        self._views()

    def keep_rows(self, moves: list[tuple[int, int]], rows: int, drop_left: int) -> None:
        """Row `source` into row `target` for each move, then the first `rows` rows kept, and the first `drop_left`
        positions dropped."""
        for target, source in moves:
            self._k[target, :, self._start:self._end] = self._k[source, :, self._start:self._end]
            self._v[target, :, self._start:self._end] = self._v[source, :, self._start:self._end]
        self._rows = rows
        self._start += drop_left
        self._views()
