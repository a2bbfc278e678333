"""Dynamic sampling (DAPO's filter_range on a group's mean answer accuracy), a group's version, and the fixed set
of reasons a group is not stored."""

from __future__ import annotations

from zerobubble.v1 import buffer_pb2, common_pb2

# Metric labels must come from a fixed set (a label per prompt would make a time series per prompt), so the
# words of PushAck.filtered, which name the prompt, never become one.
NOT_STORED_LABELS = {
    value: name.removeprefix("NOT_STORED_").lower() for name, value in buffer_pb2.NotStored.items() if value
}


def not_stored_label(reason: int) -> str:
    """The metric label of a NotStored reason; "other" for one this version does not know."""
    return NOT_STORED_LABELS.get(reason, "other")


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

