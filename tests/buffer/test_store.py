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


def group(gid, size=10):
    return StoredGroup(gid, size, 0, Location(1, gid * 100), b"x" * size)


def test_capacity_by_groups_and_bytes_but_an_empty_queue_takes_anything():
    store = ExperienceStore(max_groups=2, max_bytes=25)
    assert store.has_room(1000)
    store.add(group(1))
    assert store.has_room(15) and not store.has_room(16)
    store.add(group(2))
    assert store.full and not store.has_room(1)


def test_commit_forgets_and_redelivery_restores_in_order():
    store = ExperienceStore(max_groups=10, max_bytes=1000)
    for gid in (1, 2, 3, 4):
        store.add(group(gid))
    for delivery, gid in enumerate((1, 2, 3), start=1):
        assert store.deliver(gid, delivery).payload == b"x" * 10
    assert store.uncommitted_bytes == 30 and store.queued_bytes == 10
    store.commit(1)
    loaded = []
    assert store.redeliver_after(1, lambda at: loaded.append(at) or b"y" * 10) == 2
    assert [g.gid for g in store.queue.values()] == [2, 3, 4]
    assert loaded == [Location(1, 300), Location(1, 200)]
    assert store.uncommitted_bytes == 0 and store.queued_bytes == 30
