"""The experience store's pieces: bounded deduplication, capacity, deliveries and commits."""

from __future__ import annotations

from zerobubble.buffer.store import ExperienceStore, ProducerDedup, StoredGroup
from zerobubble.buffer.wal import Location


def test_dedup_remembers_out_of_order_sequences_in_bounded_memory():
    dedup = ProducerDedup(window=100, max_producers=10)
    for sequence in [0, 1, 3, 5]:
        dedup.record("p", sequence)
    assert [dedup.seen("p", s) for s in range(7)] == [True, True, False, True, False, True, False]
    for sequence in [2, 4]:
        dedup.record("p", sequence)
    assert dedup.snapshot() == {"p": [5, 5, []]}, "a contiguous run collapses into its floor"
    dedup.record("p", 1000)
    assert dedup.seen("p", 899) and not dedup.seen("p", 901)
    assert len(dedup.snapshot()["p"][2]) <= 100


def test_dedup_forgets_the_least_recently_seen_producer():
    dedup = ProducerDedup(window=10, max_producers=2)
    for producer in ["a", "b", "a", "c"]:
        dedup.record(producer, 0)
    assert dedup.seen("a", 0) and dedup.seen("c", 0) and not dedup.seen("b", 0)
    restored = ProducerDedup(window=10, max_producers=2)
    restored.restore(dedup.snapshot())
    assert restored.seen("a", 0) and not restored.seen("a", 1)


def group(gid, size=10, segment=1):
    return StoredGroup(gid, size, 0, Location(segment, gid * 100), b"x" * size)


def test_capacity_by_groups_and_bytes_but_an_empty_queue_takes_anything():
    store = ExperienceStore(max_groups=2, max_bytes=25)
    assert store.has_room(1000)
    store.add(group(1))
    assert store.has_room(15) and not store.has_room(16)
    store.add(group(2))
    assert store.full and not store.has_room(1)


def test_commit_forgets_acknowledged_deliveries_and_giving_back_restores_the_order():
    store = ExperienceStore(max_groups=10, max_bytes=1000)
    for gid in (1, 2, 3, 4):
        store.add(group(gid))
    for delivery, gid in enumerate((1, 2, 3), start=1):
        assert store.deliver(gid, delivery).payload == b"x" * 10
    assert store.uncommitted_bytes == 30 and store.queued_bytes == 10 and store.unacked == {1, 2, 3}
    store.acknowledge(1)
    store.acknowledge(3)
    store.commit(3)
    assert list(store.delivered) == [2], "an unacknowledged delivery is never committed"
    store.give_back([2])
    assert [g.gid for g in store.queue.values()] == [2, 4]
    assert [g.payload for g in store.queue.values()] == [None, b"x" * 10], "given back: read from the log"
    assert store.uncommitted_bytes == 0 and store.queued_bytes == 20 and store.unacked == set()


def test_live_segments_count_groups_until_they_are_committed_or_dropped():
    store = ExperienceStore(max_groups=10, max_bytes=1000)
    for gid, segment in ((1, 1), (2, 1), (3, 2), (4, 3)):
        store.add(group(gid, segment=segment))
    store.deliver(1, 1, acked=True)
    store.deliver(2, 2, acked=True)
    store.deliver(3, 3)
    assert store.live_segments == {1: 2, 2: 1, 3: 1}
    store.commit(1)
    store.give_back([2, 3])
    assert store.live_segments == {1: 1, 2: 1, 3: 1}, "groups given back are still live"
    store.deliver(2, 4, acked=True)
    store.commit(4)
    store.remove(3)
    assert store.live_segments == {3: 1}


def test_snapshot_restores_queue_and_deliveries_without_bytes():
    store = ExperienceStore(max_groups=10, max_bytes=1000)
    for gid in (1, 2, 3):
        store.add(group(gid, segment=gid))
    store.deliver(1, 5)
    store.deliver(2, 6, acked=True)
    restored = ExperienceStore(max_groups=10, max_bytes=1000)
    restored.restore(store.snapshot(), {3: b"z" * 10})
    assert [(g.gid, g.location, g.payload) for g in restored.queue.values()] == [(3, Location(3, 300), b"z" * 10)]
    assert [(d, g.gid) for d, g in restored.delivered.items()] == [(5, 1), (6, 2)] and restored.unacked == {5}
    assert (restored.queued_bytes, restored.uncommitted_bytes, restored.next_gid) == (10, 20, 4)
    assert restored.live_segments == store.live_segments
