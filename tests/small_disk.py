"""A real small filesystem to fill up: a tmpfs mounted for the test (root only; the test skips otherwise)."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(path: Path, megabytes: int) -> Iterator[Path]:
    path.mkdir(parents=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)],
                       check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        pytest.skip(f"cannot mount a small tmpfs to fill up (needs root): {detail}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; delete it to free the space again."""
    filler = disk / "filler"
    chunk = b"\xff" * 65536
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler
