"""The limits `zerobubble bench transport` measures the buffer against, in the same run: a plain loopback TCP socket
between two processes moving the same bytes, and the disk's sequential write rate with an fsync after every record of
the log's size (what `wal.fsync: always` asks of it).

The disk is measured twice over one file in the log's folder: first into fresh blocks (as a new log segment is
written) and then over the same blocks again (as the log's spare segment is reused once the trainer commits).
On this machine's disk the two differ about five-fold, so both are reported.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

SOCKET_SINK = """
import socket, sys
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
connection, _ = listener.accept()
buffer = bytearray(4 << 20)
total = 0
while True:
    n = connection.recv_into(buffer)
    if not n:
        break
    total += n
connection.sendall(str(total).encode())
connection.close()
"""


def socket_throughput(total_bytes: int, chunk_bytes: int) -> float:
    """Bytes per second through a plain loopback TCP connection to another process, in chunks."""
    sink = subprocess.Popen([sys.executable, "-c", SOCKET_SINK], stdout=subprocess.PIPE, text=True)
    try:
        port = int(sink.stdout.readline())
        chunk = os.urandom(chunk_bytes)
        with socket.create_connection(("127.0.0.1", port)) as connection:
            started = time.perf_counter()
            for _ in range(total_bytes // chunk_bytes):
                connection.sendall(chunk)
            connection.shutdown(socket.SHUT_WR)
            received = int(connection.recv(64))
            elapsed = time.perf_counter() - started
    finally:
        sink.wait(30)
    if received != total_bytes // chunk_bytes * chunk_bytes:
        raise RuntimeError(f"the socket sink received {received} bytes")
    return received / elapsed


def disk_fsync_rates(folder: Path, record_bytes: int, records: int) -> dict[str, float]:
    """Records per second written one after another to a file in `folder`, each fsynced before the next: into fresh
    blocks ("new_file") and over them again ("reused_file"). The file is removed."""
    record = os.urandom(record_bytes)
    path = folder / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    rates = {}
    try:
        for name in ("new_file", "reused_file"):
            started = time.perf_counter()
            for i in range(records):
                os.pwrite(fd, record, i * record_bytes)
                os.fsync(fd)
            rates[name] = records / (time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return rates
