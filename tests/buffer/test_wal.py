"""The write-ahead log: framing, a torn or corrupt tail detected and cut, compaction."""

from __future__ import annotations

import logging
import os
import time
import zlib

import pytest

from zerobubble.buffer.wal import FRAME, WalCorrupt, WriteAheadLog, encode


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


def test_rewrite_replaces_the_log(tmp_path):
    fill(tmp_path, count=10)
    wal, _ = replayed(tmp_path)
    before = wal.size
    locations = wal.rewrite([(9, {"snapshot": True}, b""), (2, {"n": 7}, b"x")])
    assert wal.size < before
    assert wal.read(locations[1]).blob == b"x"
    wal.append(2, {"n": "next"})
    wal.close()
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["00000002.wal"]
    _, records = replayed(tmp_path)
    assert [meta for _, meta, _ in records] == [{"snapshot": True}, {"n": 7}, {"n": "next"}]


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
