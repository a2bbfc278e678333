"""Which samples of a mini-batch go through the model together: by count (batch.micro_batch_samples), or by a token
budget (batch.max_tokens_per_micro_batch, as verl's dynamic batch size) so that a few long responses do not set the
size of every micro-batch.

The loss is a sum over micro-batches divided by the mini-batch's normaliser, so how samples are grouped changes
the memory and the time of a step, not its update.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _cost(lengths: list[int], padded: bool) -> int:
    # Packed, a micro-batch costs its tokens; padded, every row is as long as its longest.
    return len(lengths) * max(lengths) if padded else sum(lengths)


def by_token_budget(tokens: Tensor, budget: int, *, padded: bool) -> list[list[int]]:
    """First-fit decreasing: positions of `tokens` [n] in groups costing at most `budget` each (a sample longer
    than the budget alone)."""
    bins: list[list[int]] = []
    lengths: list[list[int]] = []
    for index in sorted(range(len(tokens)), key=lambda i: (-int(tokens[i]), i)):
        length = int(tokens[index])
        for members, sizes in zip(bins, lengths, strict=True):
            if _cost([*sizes, length], padded) <= budget:
                members.append(index)
                sizes.append(length)
                break
        else:
            bins.append([index])
            lengths.append([length])
    return bins


def _split_to(bins: list[list[int]], count: int) -> list[list[int]]:
    # Halving the group with the most samples keeps every group within the budget.
    bins = [list(b) for b in bins]
    while len(bins) < count:
        largest = max(range(len(bins)), key=lambda i: len(bins[i]))
        members = bins.pop(largest)
        bins += [members[0::2], members[1::2]]
    return bins


def plan_micro_batches(indices: Tensor, tokens: Tensor, *, samples: int, budget: int | None, padded: bool,
                       agree: Callable[[int], int]) -> list[Tensor]:
    """`indices` (a mini-batch's samples, each costing tokens[i]) as micro-batches.

    `agree(count)` gives the largest count over the data-parallel ranks: with sharded weights every forward is
    collective, so every rank makes as many as the rank that needs the most (a rank with fewer splits its own).
    """
    if budget is None:
        return list(indices.split(samples))
    bins = by_token_budget(tokens[indices], budget, padded=padded)
    count = agree(len(bins))
    if count > len(indices):
        raise ValueError(f"{count} micro-batches asked of {len(indices)} samples: the ranks' mini-batches differ")
    bins = _split_to(bins, count)
    return [indices[torch.tensor(sorted(b), dtype=torch.long)] for b in bins]
