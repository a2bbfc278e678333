"""Per-token policy versions: which weights drew each token of a trajectory.

On the wire a trajectory carries them compactly, as `version_spans`: the version at each change (see
common.proto). The rollout worker writes them, the buffer checks them, the trainer expands them to one version a
token. A trajectory without spans is all of its `policy_version`, as every trajectory was before engines took
weights mid-sequence; `policy_version` is always the oldest version among its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zerobubble.common.errors import InvalidInput
from zerobubble.v1 import common_pb2


def spans_of(versions: np.ndarray) -> list[tuple[int, int]]:
    """(start, version) at each change of a per-token version array (one span when it never changes)."""
    versions = np.asarray(versions, dtype=np.int64)
    if versions.ndim != 1 or len(versions) == 0:
        raise ValueError(f"expected a non-empty 1-D array of versions, got shape {versions.shape}")
    starts = np.concatenate(([0], np.flatnonzero(versions[1:] != versions[:-1]) + 1))
    return [(int(start), int(versions[start])) for start in starts]


def version_spans(versions: np.ndarray) -> tuple[int, list[common_pb2.VersionSpan]]:
    """A trajectory's `policy_version` (the oldest) and its `version_spans` (none when one version drew all)."""
    spans = spans_of(versions)
    oldest = min(version for _, version in spans)
    if len(spans) == 1:
        return oldest, []
    return oldest, [common_pb2.VersionSpan(start=start, version=version) for start, version in spans]


def per_token(trajectory: common_pb2.Trajectory, length: int) -> np.ndarray:
    """The version of each of the trajectory's `length` tokens (int64 [length]); spans assumed valid."""
    out = np.full(length, trajectory.policy_version, dtype=np.int64)
    spans = trajectory.version_spans
    for i, span in enumerate(spans):
        end = spans[i + 1].start if i + 1 < len(spans) else length
        out[span.start:end] = span.version
    return out


def check_spans(spans: Sequence[common_pb2.VersionSpan], length: int, policy_version: int, newest: int,
                where: str) -> None:
    """Refuse spans that do not describe `length` tokens in order, name a version outside [0, newest], or
    disagree with `policy_version` being the oldest; the field named is `{where}.version_spans[i]...`."""
    if not spans:
        return
    previous = -1
    for i, span in enumerate(spans):
        field = f"{where}.version_spans[{i}]"
        if i == 0 and span.start != 0:
            raise InvalidInput(f"the first span must start at token 0, got {span.start}", field=f"{field}.start")
        if i > 0 and span.start <= previous:
            raise InvalidInput(f"starts must increase, got {span.start} after {previous}", field=f"{field}.start")
        if span.start >= length:
            raise InvalidInput(f"starts past the {length} response tokens", field=f"{field}.start")
        if not 0 <= span.version <= newest:
            raise InvalidInput(f"expected 0 to {newest}, got {span.version}", field=f"{field}.version")
        previous = span.start
    oldest = min(span.version for span in spans)
    if policy_version != oldest:
        raise InvalidInput(f"must be the oldest version of its version_spans ({oldest}), got {policy_version}",
                           field=f"{where}.policy_version")
