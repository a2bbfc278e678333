"""The write-ahead log: framing, a torn or corrupt tail detected and cut, segments rolled, released, reused."""

from __future__ import annotations

import logging
import os
import time
import zlib

import pytest

from zerobubble.buffer.wal import FRAME, HEADER, MAGIC, REUSED, SPARE, Location, WalCorrupt, WriteAheadLog, encode


def replayed(directory, **options):
    wal = WriteAheadLog(directory, **options)
    records = [(r.kind, r.meta, r.blob) for r in wal.replay()]
    return wal, records


def fill(directory, count=3, **options):
    wal, _ = replayed(directory, **options)
    locations = [wal.append(2, {"n": i}, bytes([i]) * 100) for i in range(count)]
    wal.close()
    return locations


@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
def test_records_come_back_in_order_under_every_fsync_policy(tmp_path, fsync):
    fill(tmp_path, fsync=fsync)
    wal, records = replayed(tmp_path, fsync=fsync)
    assert records == [(2, {"n": i}, bytes([i]) * 100) for i in range(3)]
    wal.close()


def test_frames_carry_zlibs_crc32_so_earlier_logs_still_replay(tmp_path):
    blob = os.urandom(1 << 20)
    pieces = encode(2, {"n": 1}, blob)
    length, crc = FRAME.unpack(pieces[0])
    assert length == len(pieces[1]) + len(blob) and crc == zlib.crc32(pieces[1] + blob)
    (tmp_path / "00000001.wal").write_bytes(b"".join(pieces))
    wal, records = replayed(tmp_path)
    assert records == [(2, {"n": 1}, blob)]
    wal.close()


def test_read_at_location(tmp_path):
    locations = fill(tmp_path)
    wal, _ = replayed(tmp_path)
    assert wal.read(locations[1]).meta == {"n": 1}
    wal.close()


def segment(directory):
    (path,) = [p for p in directory.iterdir() if p.suffix == ".wal"]
    return path


@pytest.mark.parametrize("damage", ["torn", "flipped", "garbage"])
def test_bad_tail_is_logged_kept_aside_and_cut(tmp_path, caplog, damage):
    fill(tmp_path)
    path = segment(tmp_path)
    size = path.stat().st_size
    data = bytearray(path.read_bytes())
    if damage == "torn":
        data = data[:-7]
    elif damage == "flipped":
        data[-3] ^= 0xFF
    else:
        data += b"\x05\x00\x00\x00zz"
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="zerobubble.buffer.wal"):
        wal, records = replayed(tmp_path)
    kept = 3 if damage == "garbage" else 2
    assert [meta["n"] for _, meta, _ in records] == list(range(kept))
    assert any("skipped the last" in message for message in caplog.messages)
    assert list(tmp_path.glob("*.corrupt-*")), "the bad tail is kept for inspection"
    wal.append(2, {"n": "after"})
    wal.close()
    _, again = replayed(tmp_path)
    assert [meta["n"] for _, meta, _ in again] == [*range(kept), "after"]
    if damage == "garbage":
        assert path.stat().st_size > size


def test_corruption_before_the_last_segment_refuses_to_start(tmp_path):
    fill(tmp_path)
    path = segment(tmp_path)
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    (tmp_path / "00000002.wal").write_bytes(b"")
    with pytest.raises(WalCorrupt, match="later segments follow"):
        list(WriteAheadLog(tmp_path).replay())


def segment_files(directory):
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".wal")


def test_roll_starts_a_segment_with_its_record_and_release_keeps_a_spare(tmp_path):
    wal, _ = replayed(tmp_path)
    wal.append(2, {"n": 0}, b"a" * 1000)
    assert wal.roll(9, {"snapshot": 1}) == Location(2, HEADER.size)
    kept = wal.append(2, {"n": 1}, b"b" * 1000)
    wal.roll(9, {"snapshot": 2})
    wal.append(2, {"n": 2})
    wal.release([1])
    assert wal.segments == [2, 3] and wal.read(kept).blob == b"b" * 1000
    with pytest.raises(ValueError, match="takes appends"):
        wal.release([3])
    assert (tmp_path / SPARE).exists() and segment_files(tmp_path) == ["00000002.wal", "00000003.wal"]
    wal.close()
    _, records = replayed(tmp_path)
    assert [meta for _, meta, _ in records] == [{"snapshot": 1}, {"n": 1}, {"snapshot": 2}, {"n": 2}]
    assert records[1] == (2, {"n": 1}, b"b" * 1000)


def test_without_reuse_released_segments_are_deleted(tmp_path):
    (tmp_path / SPARE).write_bytes(b"left by an earlier run")
    wal, _ = replayed(tmp_path, reuse_files=False)
    assert not (tmp_path / SPARE).exists()
    wal.append(2, {"n": 0}, b"a" * 1000)
    wal.roll(9, {"snapshot": 1})
    wal.release([1])
    wal.roll(9, {"snapshot": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000002.wal", "00000003.wal"]
    assert HEADER.unpack((tmp_path / "00000003.wal").read_bytes()[:HEADER.size])[2] == 0
    wal.close()


def test_a_reused_file_is_the_next_segment_and_its_old_bytes_are_never_records(tmp_path, caplog):
    wal, _ = replayed(tmp_path, fsync="never")
    wal.append(9, {"snapshot": 1})
    for i in range(20):
        wal.append(2, {"n": i}, bytes([i]) * 5000)
    wal.roll(9, {"snapshot": 1})
    wal.release([1])
    old_size = (tmp_path / SPARE).stat().st_size
    # Segment 3 takes the spare (segment 1's file) and starts with a record of the same size as the
    # spare's first one, so the spare's intact records follow it exactly.
    wal.roll(9, {"snapshot": 1})
    assert not (tmp_path / SPARE).exists()
    third = tmp_path / "00000003.wal"
    assert third.stat().st_size == old_size, "the reused file keeps its blocks"
    assert HEADER.unpack(third.read_bytes()[:HEADER.size])[1:] == (3, REUSED)
    # A crash: nothing cuts the file to its records (`wal` is left as a killed process leaves it).
    with caplog.at_level(logging.INFO, logger="zerobubble.buffer.wal"):
        again, records = replayed(tmp_path)
    assert [meta for _, meta, _ in records] == [{"snapshot": 1}, {"snapshot": 1}]
    assert not list(tmp_path.glob("*.corrupt-*")) and "earlier use" in caplog.text
    assert third.stat().st_size < old_size, "cut to its records"
    again.append(2, {"n": "after"})
    again.close()
    _, records = replayed(tmp_path)
    assert [meta for _, meta, _ in records] == [{"snapshot": 1}, {"snapshot": 1}, {"n": "after"}]


def test_records_of_a_reused_segment_behind_a_gap_never_come_back(tmp_path):
    wal, _ = replayed(tmp_path, fsync="never")
    wal.append(2, {"n": 0}, b"x" * 50_000)
    wal.roll(9, {"snapshot": 1})
    wal.release([1])
    wal.roll(9, {"snapshot": 2})
    locations = [wal.append(2, {"n": i}, b"y" * 100) for i in range(1, 5)]
    wal.close()
    path = tmp_path / "00000003.wal"
    data = bytearray(path.read_bytes())
    data[locations[1].offset + FRAME.size + 2] ^= 0xFF  # a page that a machine crash did not write
    path.write_bytes(bytes(data))
    wal, records = replayed(tmp_path, fsync="never")
    assert [meta for _, meta, _ in records] == [{"snapshot": 1}, {"snapshot": 2}, {"n": 1}]
    wal.append(2, {"n": 9}, b"z" * 100)  # ends where the intact record {"n": 3} began; then a crash again
    _, records = replayed(tmp_path)
    assert [meta for _, meta, _ in records][-2:] == [{"n": 1}, {"n": 9}]


def test_a_record_checks_out_only_in_its_own_segment(tmp_path):
    pieces = encode(2, {"n": 1}, b"x" * 100, seed=5)
    assert FRAME.unpack(pieces[0])[1] == zlib.crc32(pieces[1] + pieces[2], 5)
    header = HEADER.pack(MAGIC, 6, 0)
    (tmp_path / "00000006.wal").write_bytes(header + b"".join(pieces))
    wal, records = replayed(tmp_path)
    assert records == [] and list(tmp_path.glob("*.corrupt-*"))
    wal.close()


def test_a_file_headed_as_another_segment_refuses_to_start(tmp_path):
    (tmp_path / "00000004.wal").write_bytes(HEADER.pack(MAGIC, 3, 0))
    with pytest.raises(WalCorrupt, match="headed as segment 3"):
        WriteAheadLog(tmp_path)


def test_interval_policy_syncs_in_the_background(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    wal, _ = replayed(tmp_path, fsync="interval", interval_seconds=0.05)
    wal.append(1, {})
    for _ in range(100):
        if synced:
            break
        time.sleep(0.01)
    assert synced
    wal.close()


def test_one_fsync_covers_every_record_written_before_it_group_commit(tmp_path, monkeypatch):
    wal, _ = replayed(tmp_path, fsync="always")
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    # Three writers logged before the first of them got to its fsync: that one fsync makes all three durable.
    locations = [wal.append(2, {"n": i}, bytes(1000), sync=False) for i in range(3)]
    assert fsyncs == [], "an append left to sync_through does not fsync"
    wal.sync_through(locations[0])
    for location in locations[1:]:
        wal.sync_through(location)
    assert len(fsyncs) == 1
    # A record written after that fsync is not covered by it.
    later = wal.append(2, {"n": 3}, bytes(1000), sync=False)
    wal.sync_through(later)
    assert len(fsyncs) == 2
    # An ordinary append is on disk on return, and so is everything before it.
    before = wal.append(2, {"n": 4}, bytes(1000), sync=False)
    wal.append(2, {"n": 5}, bytes(1000))
    wal.sync_through(before)
    assert len(fsyncs) == 3
    wal.close()
    assert [meta["n"] for _, meta, _ in replayed(tmp_path)[1]] == list(range(6))


@pytest.mark.parametrize("fsync", ["interval", "never"])
def test_sync_through_leaves_the_disk_to_the_policy_when_it_is_not_always(tmp_path, monkeypatch, fsync):
    wal, _ = replayed(tmp_path, fsync=fsync)
    monkeypatch.setattr(os, "fsync", lambda fd: pytest.fail("fsync under policy " + fsync))
    wal.sync_through(wal.append(2, {"n": 0}, b"x", sync=False))
    monkeypatch.undo()
    wal.close()


def test_the_active_segment_grows_allocated_not_sparse(tmp_path):
    # The kernel copies a record into a sparse file's hole at several times the CPU of allocated blocks.
    wal, _ = replayed(tmp_path)
    wal.append(2, {"n": 0}, bytes(1000))
    stat = os.stat(tmp_path / f"{wal.segments[-1]:08d}.wal")
    assert stat.st_size >= 1000 and stat.st_blocks * 512 >= stat.st_size, "every byte of the file has its block"
    wal.close()
