"""Process-wide malloc tuning for processes that move multi-megabyte groups (the buffer, its clients)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


@functools.cache
def keep_large_buffers_in_heap() -> None:
    """glibc gives each buffer above its mmap threshold back to the kernel when it is freed, and the next
    one is faulted in page by page; with multi-megabyte groups that was a third of the cost of moving
    one through the buffer (3.5 MiB groups: 57 -> 83 per second here), and half of the CPU time of a
    process pulling them. Buffers up to 32 MiB are then reused from the heap instead. Once per process;
    a no-op without glibc."""
    libc_name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(libc_name), "mallopt", None) if libc_name else None
    if mallopt is None:
        return
    if not (mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) and mallopt(M_TRIM_THRESHOLD, 1024**3)):
        log.warning("could not tune the memory allocator for large groups")
