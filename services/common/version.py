"""The policy version and staleness, defined once for the buffer, the rollout workers and the trainer.

`trained_version` is the number of training steps taken (one a step, however many optimizer updates its
mini-batches make): the version of the trainer's weights, of an engine once it loaded them, and of a trajectory
sampled with them. The buffer counts in `consuming_version`: the
trained_version of the weights that will train a group pushed now. It is the trainer's trained_version until
the trainer pulls a step, then `next_version` of it (the step being trained makes those weights), so groups
pushed during that step are measured against the weights that will actually consume them.
"""

from __future__ import annotations


def next_version(trained_version: int) -> int:
    """The version a step pulled now produces."""
    return trained_version + 1


def staleness(group_version: int, consuming_version: int) -> int:
    """How many training steps lie between the weights that sampled a group and those that train it."""
    return consuming_version - group_version


def token_staleness(token_versions, consuming_version: int):
    """Staleness of each token (an array or tensor of per-token versions, common/token_versions.py).

    A trajectory whose engine took new weights mid-sequence has tokens of several versions. The metrics read the
    token-weighted mean of these: the loss is a sum over tokens, so that mean is how far behind the update's data
    is. The buffer's bound reads the oldest token instead (`policy_version`, the min): the importance weight of
    each token grows with its own staleness, and a bound on a mean would let a long old prefix through behind a
    few fresh tokens."""
    return consuming_version - token_versions


def is_stale(group_version: int, consuming_version: int, max_staleness: int | None) -> bool:
    """Whether the run's staleness bound drops the group (null: no bound)."""
    return max_staleness is not None and staleness(group_version, consuming_version) > max_staleness


def oldest_fresh_version(consuming_version: int, max_staleness: int | None) -> int:
    """The oldest weights whose groups the bound still keeps: a worker generating with older ones would make
    groups only for the buffer to drop."""
    return 0 if max_staleness is None else max(0, consuming_version - max_staleness)
