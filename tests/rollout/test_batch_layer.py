"""The continuous batcher's cache layer (kv_cache.BatchLayer) against the plain layout it stands for: every row's
positions right-aligned at the batch's width, zeros before them. Random joins (narrower and wider than the batch),
decode steps, and leaves (the last row moved into each hole, unused columns dropped), enough of each to outgrow
every buffer several times."""

from __future__ import annotations

import random

import torch

from zerobubble.rollout.kv_cache import BatchLayer

HEADS, DIM = 2, 3


def plain(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    return torch.stack([torch.cat([torch.zeros(HEADS, width - row.shape[1], DIM), row], dim=1) for row in rows])


def test_every_join_step_and_leave_keeps_the_plain_right_aligned_layout():
    rng = random.Random(0)
    torch.manual_seed(0)
    rows = [torch.randn(HEADS, 5, DIM) for _ in range(3)]
    layer = BatchLayer(plain(rows, 5), plain(rows, 5) * 2)
    width = 5
    for _ in range(400):
        action = rng.random()
        if action < 0.3 or not rows:
            new_width = rng.randint(1, width + 40)
            joining = [torch.randn(HEADS, rng.randint(1, new_width), DIM) for _ in range(rng.randint(1, 4))]
            joining[0] = torch.randn(HEADS, new_width, DIM)
            if rows:
                layer.add_rows(plain(joining, new_width), plain(joining, new_width) * 2)
            else:
                layer = BatchLayer(plain(joining, new_width), plain(joining, new_width) * 2)
                width = new_width
            rows += joining
            width = max(width, new_width)
        elif action < 0.75:
            column = torch.randn(len(rows), HEADS, 1, DIM)
            keys, values = layer.update(column, column * 2)
            rows = [torch.cat([row, column[i]], dim=1) for i, row in enumerate(rows)]
            width += 1
            assert torch.equal(keys, plain(rows, width)) and torch.equal(values, plain(rows, width) * 2)
        else:
            leaving = sorted(rng.sample(range(len(rows)), rng.randint(1, len(rows))), reverse=True)
            order = list(range(len(rows)))
            for i in leaving:
                order[i] = order[-1]
                order.pop()
            rows = [rows[i] for i in order]
            if not rows:
                continue
            used = max(row.shape[1] for row in rows)
            layer.keep_rows([(t, s) for t, s in enumerate(order) if t != s], len(rows), width - used)
            width = used
        if rows:
            assert layer.keys.shape == (len(rows), HEADS, width, DIM)
            assert torch.equal(layer.keys, plain(rows, width)), "keys differ from the plain layout"
            assert torch.equal(layer.values, plain(rows, width) * 2), "values differ from the plain layout"
            assert layer.get_seq_length() == width
