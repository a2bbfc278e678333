"""The buffer core in-process: exactly once, filters, flow control, commits, restarts, bad input."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from buffer_helpers import make_config, make_group, prompt_key, prompts_of

from zerobubble.buffer.core import Buffer, Kind
from zerobubble.buffer.prompts import PromptFileError
from zerobubble.buffer.wal import HEADER, REUSED, SPARE, encode
from zerobubble.common.codec import decode_array, encode_array
from zerobubble.common.config import ConfigError, load_config
from zerobubble.common.errors import InvalidInput
from zerobubble.v1 import common_pb2


@pytest.fixture
def open_buffer(tmp_path, clock):
    """open_buffer(**overrides) -> Buffer; calling it again with the same settings is a restart."""
    opened = []

    def start(prompts=8, **overrides):
        buffer = Buffer(make_config(tmp_path, prompts, **overrides), clock=clock)
        opened.append(buffer)
        return buffer

    yield start
    for buffer in opened:
        buffer.close()


def push_all(buffer, prompts, producer="w", first_sequence=0, **group_options):
    return [buffer.push(make_group(p, producer, first_sequence + i, **group_options)) for i, p in enumerate(prompts)]


def pulled_groups(buffer, count, wait=0.0):
    """Pulled and acknowledged, as the trainer's client does."""
    items = [i for i in buffer.pull(0, 1, count, wait) if i.payload is not None]
    assert buffer.acknowledge([i.delivery for i in items]) == []
    return [(common_pb2.ExperienceGroup.FromString(i.payload), i.delivery) for i in items]


def test_every_prompt_ends_in_exactly_one_group_and_the_end_is_signalled(open_buffer):
    buffer = open_buffer(prompts=8, prompts__epochs=2)
    for _ in range(2):
        grant = buffer.lease_prompts("w", 8)
        assert len(grant.prompts) == 8 and not grant.end_of_data
        outcomes = push_all(buffer, grant.prompts, first_sequence=grant.prompts[0].epoch * 8)
        assert all(outcome.stored for outcome in outcomes)
    items = list(buffer.pull(0, 1, 100, wait_seconds=5))
    groups = [common_pb2.ExperienceGroup.FromString(i.payload) for i in items[:-1]]
    assert items[-1].payload is None, "the stream ends with the end-of-data mark"
    assert sorted(prompt_key(g) for g in groups) == sorted((str(i), e) for i in range(8) for e in range(2))
    assert [i.delivery for i in items[:-1]] == list(range(1, 17))
    stats = buffer.stats()
    assert stats["groups_in"] == stats["groups_out"] == 16 and stats["end_of_data"] and stats["epoch"] == 2
    assert buffer.lease_prompts("w", 1).end_of_data


def test_retried_push_and_second_group_for_a_prompt_are_stored_once(open_buffer):
    buffer = open_buffer()
    prompt = buffer.lease_prompts("w", 1).prompts[0]
    assert buffer.push(make_group(prompt, "w", 7)).stored
    retried = buffer.push(make_group(prompt, "w", 7))
    assert not retried.stored and "producer and sequence" in retried.filtered
    other = buffer.push(make_group(prompt, "v", 0))
    assert not other.stored and "already has a group" in other.filtered
    assert buffer.stats()["groups_in"] == 1 and len(pulled_groups(buffer, 5)) == 1


def test_accuracy_filter_drops_counts_and_finishes_the_prompt(open_buffer):
    buffer = open_buffer(prompts=2, run_spec__filter_range=[0.01, 0.99])
    solved, mixed = buffer.lease_prompts("w", 2).prompts
    outcome = buffer.push(make_group(solved, "w", 0, correct=4))
    assert not outcome.stored and "accuracy 1.000 outside" in outcome.filtered
    assert buffer.push(make_group(mixed, "w", 1, correct=1)).stored
    stats = buffer.stats()
    assert stats["filtered"] == 1 and stats["groups_in"] == 1 and stats["end_of_data"]
    assert [prompt_key(g) for g, _ in pulled_groups(buffer, 5)] == [prompt_key(mixed)]


def test_stale_groups_are_dropped_at_pull_time(open_buffer):
    buffer = open_buffer(prompts=3, run_spec__max_staleness=1)
    old, fresh, recent = buffer.lease_prompts("w", 3).prompts
    buffer.set_policy_version(2)   # groups from versions ahead of the trainer's are refused
    buffer.push(make_group(old, "w", 0, version=0))
    buffer.push(make_group(fresh, "w", 1, version=2))
    buffer.push(make_group(recent, "w", 2, version=1))
    assert [prompt_key(g) for g, _ in pulled_groups(buffer, 5)] == [prompt_key(fresh), prompt_key(recent)]
    assert buffer.stats()["stale_dropped"] == 1


def test_stale_drops_are_logged_once_a_batch_with_their_versions(open_buffer, caplog):
    buffer = open_buffer(prompts=6, run_spec__max_staleness=1)
    prompts = buffer.lease_prompts("w", 6).prompts
    buffer.set_policy_version(6)
    for sequence, (prompt, version) in enumerate(zip(prompts, (0, 1, 2, 3, 6, 6), strict=True)):
        buffer.push(make_group(prompt, "w", sequence, version=version))
    with caplog.at_level("INFO", logger="zerobubble.buffer.core"):
        assert len(pulled_groups(buffer, 5)) == 2
    lines = [r.getMessage() for r in caplog.records if "stale" in r.getMessage()]
    assert lines == ["dropped 4 groups as stale (policy versions 0 to 3, more than run.max_staleness=1 behind 6); "
                     "4 dropped so far"]


def test_groups_ahead_of_the_trainer_are_refused_and_dropped_when_it_goes_back(open_buffer, caplog):
    buffer = open_buffer(prompts=4)
    prompts = buffer.lease_prompts("w", 4).prompts
    buffer.set_policy_version(20)
    for sequence, prompt in enumerate(prompts[:3]):
        buffer.push(make_group(prompt, "w", sequence, version=20 - sequence))
    with pytest.raises(InvalidInput, match="expected 0 to 20 .*got 21") as refused:
        buffer.push(make_group(prompts[3], "w", 3, version=21))
    assert refused.value.field.endswith(".policy_version")
    with caplog.at_level("WARNING", logger="zerobubble.buffer.core"):
        buffer.set_policy_version(19)
        buffer.set_policy_version(0)
    assert [r.getMessage() for r in caplog.records] == [
        "dropped 1 queued groups sampled by policy versions up to 20, ahead of the trainer's 19 (weights it does "
        "not have)",
        "dropped 2 queued groups sampled by policy versions up to 19, ahead of the trainer's 0 (weights it does "
        "not have)"]
    assert buffer.stats()["stale_dropped"] == 3 and pulled_groups(buffer, 3) == []


def test_few_surviving_groups_do_not_hang_the_trainer(open_buffer):
    buffer = open_buffer(prompts=4, run_spec__filter_range=[0.01, 0.99])
    prompts = buffer.lease_prompts("w", 4).prompts
    buffer.push(make_group(prompts[0], "w", 0, correct=2))
    for i, prompt in enumerate(prompts[1:], start=1):
        buffer.push(make_group(prompt, "w", i, correct=0))
    started = time.monotonic()
    items = list(buffer.pull(0, 1, 4, wait_seconds=30))
    assert time.monotonic() - started < 2
    assert len(items) == 2 and items[0].payload is not None and items[1].payload is None


def test_a_full_buffer_stops_leases_and_makes_pushes_wait(open_buffer):
    buffer = open_buffer(prompts=6, capacity__max_groups=2)
    prompts = prompts_of(buffer, 3)
    push_all(buffer, prompts[:2])
    assert buffer.lease_prompts("w", 3).prompts == []
    outcome = []
    pusher = threading.Thread(target=lambda: outcome.append(buffer.push(make_group(prompts[2], "w", 2))))
    pusher.start()
    pusher.join(0.3)
    assert pusher.is_alive() and buffer.stats()["groups_in"] == 2
    assert len(pulled_groups(buffer, 1)) == 1
    pusher.join(5)
    assert outcome and outcome[0].stored
    assert len(buffer.lease_prompts("w", 3).prompts) == 0, "still full: two queued groups"
    pulled_groups(buffer, 1)
    # Room for one group: a lease gets no more, and prompts out on lease count as groups on their way.
    assert len(buffer.lease_prompts("w", 3).prompts) == 1
    assert buffer.lease_prompts("w", 1).prompts == [], "one queued and one on lease fill the two places"


def test_no_prompts_are_leased_once_training_has_finished_until_a_trainer_trains_again(open_buffer):
    buffer = open_buffer(prompts=6)
    assert len(buffer.lease_prompts("w", 2).prompts) == 2
    buffer.set_policy_version(3, training_finished=True)
    grant = buffer.lease_prompts("w", 2)
    assert grant.prompts == [] and grant.training_finished and not grant.end_of_data
    buffer.close()
    buffer = open_buffer(prompts=6)   # restarted: the mark is in its log
    assert buffer.training_finished and buffer.lease_prompts("w", 2).prompts == []
    buffer.set_policy_version(3)   # a resumed trainer
    grant = buffer.lease_prompts("w", 2)
    assert len(grant.prompts) == 2 and not grant.training_finished


def test_expired_leases_come_back_and_are_counted(open_buffer, clock):
    buffer = open_buffer(prompts=4, leases__timeout_seconds=5)
    first = buffer.lease_prompts("w1", 2)
    clock.advance(6)
    assert buffer.stats()["lease_expirations"] == 1
    again = buffer.lease_prompts("w2", 2)
    assert [p.prompt_id for p in again.prompts] == [p.prompt_id for p in first.prompts]
    buffer.complete_lease(first.lease_id)


def test_commit_forgets_and_resume_delivers_the_rest_again(open_buffer):
    buffer = open_buffer(prompts=4)
    push_all(buffer, buffer.lease_prompts("w", 4).prompts)
    first = pulled_groups(buffer, 4)
    buffer.commit(2)
    assert pulled_groups(buffer, 4) == []
    buffer.commit(2, resume=True)
    again = pulled_groups(buffer, 4)
    assert [prompt_key(g) for g, _ in again] == [prompt_key(g) for g, _ in first[2:]]
    assert [d for _, d in again] == [5, 6]
    with pytest.raises(InvalidInput, match="delivery"):
        buffer.commit(99)


def test_restart_keeps_acknowledged_groups_once_the_epoch_position_and_returns_leases(open_buffer):
    buffer = open_buffer(prompts=8)
    grant = buffer.lease_prompts("w", 5)
    push_all(buffer, grant.prompts[:3])
    (delivered, _), = pulled_groups(buffer, 1)
    buffer.set_policy_version(3)
    buffer.close()

    buffer = open_buffer(prompts=8)
    stats = buffer.stats()
    assert (stats["queued_groups"], stats["groups_in"], stats["groups_out"], stats["policy_version"]) == (2, 3, 1, 3)
    unfinished = {p.prompt_id for p in buffer.lease_prompts("w", 8).prompts}
    assert unfinished == {str(i) for i in range(8)} - {p.prompt_id for p in grant.prompts[:3]}
    assert not buffer.push(make_group(grant.prompts[0], "w", 0)).stored
    queued = pulled_groups(buffer, 8)
    assert [prompt_key(g) for g, _ in queued] == [prompt_key(p) for p in grant.prompts[1:3]]
    buffer.commit(0, resume=True)
    assert [prompt_key(g) for g, _ in pulled_groups(buffer, 8)] == [prompt_key(g) for g in [delivered]] + [
        prompt_key(g) for g, _ in queued
    ]


def test_segments_roll_and_are_released_once_consumed_and_the_state_survives(open_buffer, tmp_path):
    # Groups of about 8 KiB: a new segment every two or three groups.
    options = {"prompts": 24, "prompts__epochs": 2, "wal__segment_bytes": 20_000, "capacity__dedup_window": 4}
    buffer = open_buffer(**options)
    prompts = buffer.lease_prompts("w", 24).prompts
    push_all(buffer, prompts, tokens=256)
    pulled_groups(buffer, 16)
    buffer.commit(12)
    segments = buffer.wal.segments
    assert segments[-1] > 8 and segments[0] == buffer.store.delivered[13].location.segment
    assert all(buffer.store.live_segments[number] for number in segments[:-1]), "only segments still needed"
    assert sorted(p.name for p in (tmp_path / "wal").iterdir()) == [f"{n:08d}.wal" for n in segments] + [SPARE]
    expected = buffer.stats()
    buffer.close()

    buffer = open_buffer(**options)
    assert buffer.stats() == expected
    assert not buffer.push(make_group(prompts[3], "w", 3)).stored
    buffer.commit(12, resume=True)
    again = pulled_groups(buffer, 24)
    assert [prompt_key(g) for g, _ in again] == [prompt_key(p) for p in prompts[12:]]
    assert [d for _, d in again] == list(range(17, 29))
    next_epoch = buffer.lease_prompts("w", 24).prompts
    assert {p.epoch for p in next_epoch} == {1} and len(next_epoch) == 24


def test_a_crash_in_a_reused_segment_replays_exactly_the_acknowledged_state(open_buffer, tmp_path):
    options = {"prompts": 40, "wal__segment_bytes": 30_000}
    buffer = open_buffer(**options)
    prompts = buffer.lease_prompts("w", 40).prompts
    for i, prompt in enumerate(prompts[:30]):  # a trainer step of three groups, then a commit
        push_all(buffer, [prompt], first_sequence=i, tokens=256)
        (_, delivery), = pulled_groups(buffer, 1)
        if delivery % 3 == 0:
            buffer.commit(delivery)
    push_all(buffer, prompts[30:35], first_sequence=30, tokens=256)
    assert [d for _, d in pulled_groups(buffer, 2)] == [31, 32]
    buffer.set_policy_version(4)
    active = tmp_path / "wal" / f"{buffer.wal.segments[-1]:08d}.wal"
    assert HEADER.unpack(active.read_bytes()[:HEADER.size])[2] == REUSED
    assert active.stat().st_size > HEADER.size + buffer.wal.active_bytes, "older records follow the last one"
    expected = buffer.stats()
    # A crash: the buffer is never closed, so nothing cuts its file to its records.

    buffer = open_buffer(**options)
    assert buffer.stats() == expected
    buffer.commit(30, resume=True)
    again = pulled_groups(buffer, 40)
    assert [prompt_key(g) for g, _ in again] == [prompt_key(p) for p in prompts[30:35]]
    assert {p.prompt_id for p in buffer.lease_prompts("w", 40).prompts} == {p.prompt_id for p in prompts[35:]}


def test_a_log_compacted_by_an_earlier_version_still_replays(open_buffer, tmp_path):
    buffer = open_buffer(prompts=4)
    prompts = buffer.lease_prompts("w", 4).prompts
    push_all(buffer, prompts[:3])
    pulled_groups(buffer, 1)
    snapshot = buffer._snapshot()
    del snapshot["groups"]
    # Compaction wrote the state, then a copy of every live group (and of its delivery), headerless.
    records = [encode(Kind.SNAPSHOT, snapshot)]
    for delivery, group in buffer.store.delivered.items():
        records.append(encode(Kind.GROUP, {"gid": group.gid, "version": 0, "copy": True},
                              buffer.wal.read(group.location).blob))
        records.append(encode(Kind.DELIVERED, {"gid": group.gid, "delivery": delivery, "copy": True}))
    for group in buffer.store.queue.values():
        records.append(encode(Kind.GROUP, {"gid": group.gid, "version": 0, "copy": True}, group.payload))
    expected = buffer.stats()
    buffer.close()
    for path in (tmp_path / "wal").iterdir():
        path.unlink()
    (tmp_path / "wal" / "00000004.wal").write_bytes(b"".join(piece for record in records for piece in record))

    buffer = open_buffer(prompts=4)
    assert buffer.stats() == expected
    buffer.commit(0, resume=True)
    assert [prompt_key(g) for g, _ in pulled_groups(buffer, 4)] == [prompt_key(p) for p in prompts[:3]]
    assert [p.prompt_id for p in buffer.lease_prompts("w", 4).prompts] == [prompts[3].prompt_id]


BAD_GROUPS = {
    "trajectories[0].response_ids.data": lambda g: setattr(g.trajectories[0].response_ids, "data", b"abc"),
    "trajectories[1].response_ids": lambda g: (
        g.trajectories[1].response_ids.ClearField("shape"), g.trajectories[1].response_ids.shape.append(0),
        setattr(g.trajectories[1].response_ids, "data", b""),
    ),
    "trajectories[2].behaviour_logprobs": lambda g: g.trajectories[2].behaviour_logprobs.CopyFrom(
        encode_array(np.zeros(3, dtype=np.float32))
    ),
    "trajectories[3].response_ids.dtype": lambda g: setattr(g.trajectories[3].response_ids, "dtype", 9),
    "trajectories": lambda g: g.trajectories.pop(),
    "prompt_ids.shape": lambda g: g.prompt_ids.shape.append(1),
    "prompt.prompt_id": lambda g: setattr(g.prompt, "prompt_id", "no-such-prompt"),
    "prompt.epoch": lambda g: setattr(g.prompt, "epoch", 5),
    "lease_id": lambda g: setattr(g, "lease_id", "7.0"),
    "producer_id": lambda g: setattr(g, "producer_id", ""),
    "sequence": lambda g: setattr(g, "sequence", -1),
    "group": lambda g: setattr(g.trajectories[0], "response_text", "x" * 5000),
}


@pytest.mark.parametrize("field", BAD_GROUPS)
def test_bad_groups_are_refused_whole_naming_the_field(open_buffer, field):
    buffer = open_buffer(prompts=2, run_spec__num_generations=4, capacity__max_group_bytes=4096)
    prompt = buffer.lease_prompts("w", 1).prompts[0]
    group = make_group(prompt, "w", 0)
    BAD_GROUPS[field](group)
    with pytest.raises(InvalidInput) as refused:
        buffer.push(group)
    assert refused.value.field == field
    assert buffer.stats()["groups_in"] == 0
    assert buffer.push(make_group(prompt, "w", 0)).stored, "nothing of the refused group was kept"


def test_bad_requests_name_the_field(open_buffer):
    buffer = open_buffer()
    cases = [
        (lambda: buffer.lease_prompts("", 1), "worker_id"),
        (lambda: buffer.lease_prompts("w", 0), "count"),
        (lambda: buffer.complete_lease("0.0", ["nope"]), "prompt_ids[0]"),
        (lambda: list(buffer.pull(2, 2, 1, 0)), "rank"),
        (lambda: list(buffer.pull(0, 0, 1, 0)), "world_size"),
        (lambda: list(buffer.pull(0, 1, 0, 0)), "max_groups"),
        (lambda: list(buffer.pull(0, 1, 1, -1)), "wait_seconds"),
        (lambda: buffer.set_policy_version(-1), "version"),
    ]
    for call, field in cases:
        with pytest.raises(InvalidInput) as refused:
            call()
        assert refused.value.field == field


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"run_spec.filter_range": [0.9, 0.1]}, "run_spec.filter_range"),
        ({"capacity.max_group_bytes": 128 * 1024 * 1024}, "capacity.max_group_bytes"),
        ({"wal.fsync": "sometimes"}, "wal.fsync"),
        ({"leases.timeout_seconds": 0}, "leases.timeout_seconds"),
        ({"leases.timout_seconds": 1}, "leases.timout_seconds"),
    ],
)
def test_config_errors_name_the_field(tmp_path, overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(type(make_config(tmp_path)), None, {"prompts.path": "p.jsonl", **overrides})


def test_prompts_are_required(tmp_path):
    with pytest.raises(ConfigError, match="prompts"):
        load_config(type(make_config(tmp_path)), None, {})


def test_the_seeded_order_survives_a_restart(open_buffer):
    buffer = open_buffer(prompts=8, prompts__seed=5)
    ids = [p.prompt_id for p in buffer.lease_prompts("w", 8).prompts]
    assert [int(i) for i in ids] == list(buffer.source.order(0))
    buffer.close()
    assert [p.prompt_id for p in open_buffer(prompts=8, prompts__seed=5).lease_prompts("w", 8).prompts] == ids


def test_a_log_written_for_other_prompts_is_not_replayed(open_buffer):
    open_buffer(prompts=8).close()
    with pytest.raises(PromptFileError, match="different prompt set"):
        open_buffer(prompts=9)


def test_leases_report_the_epochs_progress(open_buffer):
    buffer = open_buffer(prompts=8, prompts__epochs=2)
    first = buffer.lease_prompts("w", 3)
    assert (first.epoch_size, first.epoch_finished) == (8, 0)
    push_all(buffer, first.prompts)
    second = buffer.lease_prompts("w", 5)
    assert second.epoch_finished == 3 and {p.epoch for p in second.prompts} == {0}
    push_all(buffer, second.prompts, first_sequence=3)
    third = buffer.lease_prompts("w", 1)
    assert third.prompts[0].epoch == 1 and third.epoch_finished == 0


def test_an_episode_group_keeps_its_loss_masks_and_turns_through_a_restart(open_buffer):
    buffer = open_buffer(prompts=2)
    prompt = buffer.lease_prompts("w", 1).prompts[0]
    group = make_group(prompt, "w", 0)
    masks = [[1, 1, 0, 0, 0, 1, 1, 1], [1, 0, 0, 0, 0, 0, 0, 1], [1] * 8, [1, 1, 1, 1, 0, 0, 1, 1]]
    for trajectory, mask in zip(group.trajectories, masks, strict=True):
        trajectory.loss_mask.CopyFrom(encode_array(np.asarray(mask, dtype=np.uint8)))
        trajectory.episode.CopyFrom(common_pb2.EpisodeInfo(environment="calculator", turns=2, tool_calls=1,
                                                           step_rewards=[0.0, 1.0], ended_reason="done"))
    assert buffer.push(group).stored
    buffer.close()

    (replayed, _), = pulled_groups(open_buffer(prompts=2), 1)
    assert [decode_array(t.loss_mask, "m").tolist() for t in replayed.trajectories] == masks
    assert replayed.trajectories[1].episode == group.trajectories[1].episode
