"""The weight-sync protocol's table (services/common/sync_protocol.py) is what the code does: real receivers and a
real broadcaster on loopback move through its transitions, an illegal move raises, and every transition names a
test that exists."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import pytest
import torch
from sync_helpers import StandInEngine, digests, tiny_model, trainer_service

from zerobubble.common.clients.trainer import TrainerClient
from zerobubble.common.config import ClientConfig
from zerobubble.common.sync_protocol import (
    ANY,
    TRANSITIONS,
    Copier,
    IllegalTransition,
    Machine,
    Member,
    Membership,
    Sender,
)
from zerobubble.rollout.weight_receiver import WeightReceiver

ROOT = Path(__file__).resolve().parents[2]


def wait_until(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def receivers(address: str, *ids: str) -> list[WeightReceiver]:
    return [WeightReceiver(TrainerClient(ClientConfig(address=address)), worker_id, first_backoff_s=0.05,
                           max_backoff_s=0.5).start() for worker_id in ids]


def test_every_transition_names_a_test_that_exists():
    for transition in TRANSITIONS:
        path, _, name = transition.test.partition("::")
        tree = ast.parse((ROOT / path).read_text())
        assert name in {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}, transition


def test_a_move_the_table_does_not_have_is_refused():
    member = Machine(Member.JOINING)
    with pytest.raises(IllegalTransition, match="joining -> receiving"):
        member.to(Member.RECEIVING)
    member.to(Member.WATCHING)
    member.to(Member.JOINING)   # from any state
    assert member.took(Member.WATCHING, Member.JOINING) and not member.took(Member.JOINING, Member.RECEIVING)
    sender = Machine(Sender.IDLE)
    with pytest.raises(IllegalTransition):
        sender.to(Sender.AWAITING_ACKS)


def test_members_form_a_group_receive_versions_and_keep_it_for_the_next():
    with trainer_service(bucket_mb=0.05) as trainer:
        members = receivers(trainer.address, "w1", "w2")
        try:
            trainer.wait_members({"w1", "w2"})
            wait_until(lambda: all(m.state.state is Member.WATCHING for m in members), what="both watching")
            model = tiny_model(seed=4)
            for version in (1, 2):
                with torch.no_grad():
                    next(model.parameters()).add_(0.25)
                trainer.broadcaster.publish(model.named_parameters(), version)
                assert trainer.broadcaster.wait_synced(version, timeout=60)
                for member in members:
                    engine = StandInEngine(tiny_model(seed=9))
                    wait_until(lambda m=member, v=version: m.latest_version == v, what=f"version {version}")
                    assert member.apply_to(engine) and digests(engine.model.named_parameters()) == \
                        digests(model.named_parameters())
            for member in members:
                for move in [(Member.JOINING, Member.WATCHING), (Member.WATCHING, Member.ARRIVED),
                             (Member.ARRIVED, Member.IN_GROUP), (Member.IN_GROUP, Member.RECEIVING),
                             (Member.RECEIVING, Member.IN_GROUP)]:
                    assert member.state.took(*move), (member.worker_id, move, list(member.state.history))
                # The second version came to the same group: one arrival only.
                assert sum(1 for moved in member.state.history if moved[1] is Member.ARRIVED) == 1
            sender = trainer.broadcaster.sender_state
            for move in [(Sender.IDLE, Sender.FORMING), (Sender.FORMING, Sender.BROADCASTING),
                         (Sender.BROADCASTING, Sender.AWAITING_ACKS), (Sender.AWAITING_ACKS, Sender.IDLE),
                         (Sender.IDLE, Sender.BROADCASTING)]:
                assert sender.took(*move), (move, list(sender.history))
            copier = trainer.broadcaster.copier.state
            assert copier.took(Copier.WAITING, Copier.COPYING) and copier.took(Copier.COPYING, Copier.WAITING)
            assert all(trainer.broadcaster._members[w].state.took(Membership.JOINED, Membership.WATCHING)
                       for w in ("w1", "w2"))
        finally:
            for member in members:
                member.close()


def test_a_member_that_never_arrives_is_dropped_and_the_others_form_without_it():
    with trainer_service(bucket_mb=0.05, formation_timeout_s=1.0) as trainer:
        (real,) = receivers(trainer.address, "real")
        try:
            trainer.wait_members({"real"})
            model = tiny_model(seed=5)
            trainer.broadcaster.publish(model.named_parameters(), 1)
            assert trainer.broadcaster.wait_synced(1, timeout=60)
            # A member that joins and watches, and never writes its arrived key.
            with TrainerClient(ClientConfig(address=trainer.address)) as client:
                client.join("silent")
                first = client.watch("silent")
                trainer.wait_members({"real", "silent"})
                silent = trainer.broadcaster._members["silent"]
                wait_until(lambda: silent.state.state is Membership.WATCHING, what="the first watch")
                stream = client.watch("silent")
                wait_until(lambda: silent.state.took(Membership.WATCHING, Membership.WATCHING), what="a second watch")
                ended = threading.Event()
                threading.Thread(target=lambda: (list(first), ended.set()), daemon=True).start()
                assert ended.wait(10), "the older watch stream ends"
                trainer.broadcaster.publish(model.named_parameters(), 2)
                assert trainer.broadcaster.wait_synced(2, timeout=60)
                stream.cancel()
            assert silent.state.took(ANY, Membership.GONE) and "silent" not in trainer.broadcaster.members
            assert trainer.broadcaster.sender_state.took(Sender.FORMING, Sender.FORMING)
            assert trainer.broadcaster.sender_state.took(ANY, Sender.IDLE)
            # The real member left its group for the epoch with the silent one, was told to abort, and arrived at
            # the next epoch without it.
            assert real.state.took(Member.IN_GROUP, Member.ARRIVED)
            assert real.state.took(Member.ARRIVED, Member.WATCHING)
            assert real.latest_version == 2
        finally:
            real.close()
        assert real.state.took(ANY, Member.JOINING)


def test_a_receive_that_breaks_is_acknowledged_as_failed_and_the_version_comes_again(monkeypatch):
    from zerobubble.rollout import weight_receiver

    real_wait = weight_receiver.wait_broadcast
    broke = []

    def breaks_once(works, **options):
        if not broke:
            broke.append(True)
            real_wait(works, **options)
            raise RuntimeError("Connection reset by peer")
        return real_wait(works, **options)

    monkeypatch.setattr(weight_receiver, "wait_broadcast", breaks_once)
    with trainer_service(bucket_mb=0.05) as trainer:
        (member,) = receivers(trainer.address, "w1")
        try:
            trainer.wait_members({"w1"})
            model = tiny_model(seed=6)
            trainer.broadcaster.publish(model.named_parameters(), 1)
            assert trainer.broadcaster.wait_synced(1, timeout=60)
            assert broke and member.latest_version == 1
            assert member.state.took(Member.RECEIVING, Member.WATCHING)
            assert trainer.broadcaster.sender_state.took(Sender.AWAITING_ACKS, Sender.FORMING)
        finally:
            member.close()


def test_a_broadcast_that_fails_on_the_trainer_is_given_up_and_sent_to_a_new_epoch(monkeypatch):
    from zerobubble.trainer import broadcaster

    real_wait = broadcaster.wait_broadcast
    failed = []

    def fails_once(works, **options):
        real_wait(works, **options)
        if not failed:
            failed.append(True)
            raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(broadcaster, "wait_broadcast", fails_once)
    with trainer_service(bucket_mb=0.05) as trainer:
        (member,) = receivers(trainer.address, "w1")
        try:
            trainer.wait_members({"w1"})
            trainer.broadcaster.publish(tiny_model(seed=7).named_parameters(), 1)
            assert trainer.broadcaster.wait_synced(1, timeout=60)
            assert failed and trainer.broadcaster.sender_state.took(Sender.BROADCASTING, Sender.FORMING)
            wait_until(lambda: member.latest_version == 1, what="version 1 at the new epoch")
            assert sum(1 for moved in member.state.history if moved[1] is Member.ARRIVED) == 2
        finally:
            member.close()
