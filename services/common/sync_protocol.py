"""The weight-sync protocol as states and transitions, in one table for both ends.

Four parts take part, each a small state machine: on the trainer, the membership of each worker, the copier
(published weights into the spare send buffers) and the sender (forming a group epoch, broadcasting, waiting for
acknowledgements); on each rollout worker, the member. Their code moves only through `Machine.to`, which refuses a
transition the table does not have, so the table is what the code does. docs/concepts/weight-sync.md is made from
it; each transition names the test that takes it. The wire (JoinWeightSync, WatchWeights) is in
protos/zerobubble/v1/trainer.proto, the store keys in services/common/weight_sync.py.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from enum import Enum


class Member(Enum):
    """A rollout worker's side (services/rollout/weight_receiver.py)."""

    JOINING = "joining"        # asking the trainer to join (again, after backoff, when anything went wrong)
    WATCHING = "watching"      # joined; following announcements, in no group
    ARRIVED = "arrived"        # named at a new group epoch; wrote its arrived key, waiting for go or abort
    IN_GROUP = "in group"      # the epoch's process group is formed; between versions
    RECEIVING = "receiving"    # a version's buckets are coming in


class Membership(Enum):
    """The trainer's record of one worker (services/trainer/broadcaster.py, join/watch/drop)."""

    JOINED = "joined"
    WATCHING = "watching"
    GONE = "gone"


class Copier(Enum):
    """The trainer's copier thread: published weights into the spare buffers while training goes on."""

    WAITING = "waiting"
    COPYING = "copying"


class Sender(Enum):
    """The trainer's sender thread, one version at a time."""

    IDLE = "idle"
    FORMING = "forming"                  # a new group epoch announced; waiting for every member to arrive
    BROADCASTING = "broadcasting"        # the version's buckets go out to the group
    AWAITING_ACKS = "awaiting acks"      # every member's done key, ok or failed


ANY = "any"


@dataclass(frozen=True)
class Transition:
    source: Enum | str       # ANY: from every state
    target: Enum
    trigger: str
    test: str                # the test that takes it: tests/...py::name


_SYNC = "tests/trainer/test_sync_protocol.py"
TRANSITIONS: tuple[Transition, ...] = (
    # The member (a rollout worker).
    Transition(Member.JOINING, Member.WATCHING, "JoinWeightSync answered and WatchWeights opened",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Member.WATCHING, Member.ARRIVED, "an announcement names it at a new group epoch: it writes arrived",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Member.ARRIVED, Member.IN_GROUP, "go: every member arrived, the epoch's group is formed",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Member.ARRIVED, Member.WATCHING, "abort (a member did not arrive in time), or the group did not form",
               f"{_SYNC}::test_a_member_that_never_arrives_is_dropped_and_the_others_form_without_it"),
    Transition(Member.IN_GROUP, Member.RECEIVING, "an announcement of a version at its epoch",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Member.IN_GROUP, Member.ARRIVED, "an announcement names it at a newer epoch: it leaves the old group",
               f"{_SYNC}::test_a_member_that_never_arrives_is_dropped_and_the_others_form_without_it"),
    Transition(Member.IN_GROUP, Member.WATCHING, "a newer epoch leaves it out: it leaves the group",
               "tests/trainer/test_weight_sync_joins.py::"
               "test_members_that_never_form_the_group_are_dropped_within_the_formation_timeout"),
    Transition(Member.RECEIVING, Member.IN_GROUP, "every bucket is in: it writes done ok",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Member.RECEIVING, Member.WATCHING, "the receive broke, or the trainer wrote the epoch broken: it writes "
               "done failed and leaves the group",
               f"{_SYNC}::test_a_receive_that_breaks_is_acknowledged_as_failed_and_the_version_comes_again"),
    Transition(ANY, Member.JOINING, "the watch stream ended (dropped, trainer gone) or the session failed: it leaves "
               "any group and joins again after a backoff",
               f"{_SYNC}::test_a_member_that_never_arrives_is_dropped_and_the_others_form_without_it"),
    # The trainer's record of a member.
    Transition(Membership.JOINED, Membership.WATCHING, "WatchWeights opened",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Membership.WATCHING, Membership.WATCHING, "another WatchWeights: the older stream ends",
               f"{_SYNC}::test_a_member_that_never_arrives_is_dropped_and_the_others_form_without_it"),
    Transition(ANY, Membership.GONE, "dropped: its watch closed, it did not arrive at an epoch, the same id joined "
               "again, or the trainer closed",
               f"{_SYNC}::test_a_member_that_never_arrives_is_dropped_and_the_others_form_without_it"),
    # The copier.
    Transition(Copier.WAITING, Copier.COPYING, "publish: the training loop handed a version over",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Copier.COPYING, Copier.WAITING, "the version is in the spare buffers (the sender is told), or the "
               "copy failed (raised at the caller's next wait)",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    # The sender.
    Transition(Sender.IDLE, Sender.FORMING, "a version to send and the members changed (or no group yet): a new "
               "epoch is announced with every member's rank",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Sender.IDLE, Sender.BROADCASTING, "a version to send to the same group: announced without a new epoch",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Sender.FORMING, Sender.BROADCASTING, "every member arrived: go, and the group is formed",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Sender.FORMING, Sender.FORMING, "someone did not arrive in formation_timeout_s: abort, drop them, try "
               "a new epoch (or the group did not form: try again)",
               f"{_SYNC}::test_a_member_that_never_arrives_is_dropped_and_the_others_form_without_it"),
    Transition(Sender.BROADCASTING, Sender.AWAITING_ACKS, "the buckets are sent",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Sender.BROADCASTING, Sender.FORMING, "the broadcast failed: the epoch is written broken and re-formed",
               f"{_SYNC}::test_a_broadcast_that_fails_on_the_trainer_is_given_up_and_sent_to_a_new_epoch"),
    Transition(Sender.AWAITING_ACKS, Sender.IDLE, "every member wrote done ok: the version is synced",
               f"{_SYNC}::test_members_form_a_group_receive_versions_and_keep_it_for_the_next"),
    Transition(Sender.AWAITING_ACKS, Sender.FORMING, "a member wrote failed, left, or was silent for "
               "member_timeout_s: the epoch is written broken and re-formed, and the version sent again",
               "tests/trainer/test_broadcaster_service.py::"
               "test_a_member_that_leaves_before_acknowledging_ends_the_trainers_wait_at_once"),
    Transition(ANY, Sender.IDLE, "no member left, max_attempts failed attempts, or the trainer closed",
               f"{_SYNC}::test_a_member_that_never_arrives_is_dropped_and_the_others_form_without_it"),
)


class IllegalTransition(RuntimeError):
    """The code tried a move the protocol's table does not have: a bug, never a peer's doing."""


def _allowed(source: Enum, target: Enum) -> bool:
    return any(t.target is target and (t.source is source or t.source == ANY) for t in TRANSITIONS)


class Machine:
    """One part's state; `to` moves it along the table. Keeps its recent moves (for tests and logs)."""

    def __init__(self, start: Enum, history: int = 256):
        self.state = start
        self.history: deque[tuple[Enum, Enum]] = deque(maxlen=history)
        self._lock = threading.Lock()

    def to(self, target: Enum) -> None:
        with self._lock:
            if not _allowed(self.state, target):
                raise IllegalTransition(f"{type(target).__name__}: {self.state.value} -> {target.value} is not a "
                                        f"transition of the weight-sync protocol")
            self.history.append((self.state, target))
            self.state = target

    def took(self, source: Enum | str, target: Enum) -> bool:
        """Whether this machine has made that move (ANY: from any state) among its recent ones."""
        return any(moved[1] is target and (source == ANY or moved[0] is source) for moved in self.history)
