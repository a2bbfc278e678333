"""Dynamic sampling (DAPO's filter_range on a group's mean answer accuracy) and a group's version."""

from __future__ import annotations

from zerobubble.v1 import common_pb2


def mean_accuracy(group: common_pb2.ExperienceGroup) -> float:
    return sum(t.answer_ok for t in group.trajectories) / len(group.trajectories)


def accuracy_rejection(group: common_pb2.ExperienceGroup, accuracy_range: tuple[float, float] | None) -> str:
    """Why the group is dropped ("" to keep it): all-right or all-wrong groups carry no GRPO signal."""
    if accuracy_range is None:
        return ""
    low, high = accuracy_range
    accuracy = mean_accuracy(group)
    if low <= accuracy <= high:
        return ""
    return f"mean answer accuracy {accuracy:.3f} outside [{low}, {high}]"


def group_version(group: common_pb2.ExperienceGroup) -> int:
    """The oldest policy version among the group's trajectories: staleness is that of its oldest sample."""
    return min(t.policy_version for t in group.trajectories)

