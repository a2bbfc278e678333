"""The fixed set of reasons the buffer does not store a group, as metric labels: the buffer counts them and its
producers count what they were told."""

from __future__ import annotations

from zerobubble.v1 import buffer_pb2

# Metric labels must come from a fixed set (a label per prompt would make a time series per prompt), so the
# words of PushAck.filtered, which name the prompt, never become one.
NOT_STORED_LABELS = {
    value: name.removeprefix("NOT_STORED_").lower() for name, value in buffer_pb2.NotStored.items() if value
}


def not_stored_label(reason: int) -> str:
    """The metric label of a NotStored reason; "other" for one this version does not know."""
    return NOT_STORED_LABELS.get(reason, "other")
