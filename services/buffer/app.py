"""The buffer as a service: the hooks `zerobubble serve buffer` uses."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.buffer.core import Buffer
from zerobubble.buffer.metrics import BufferMetrics
from zerobubble.buffer.servicer import SERVICE, BufferServicer, register
from zerobubble.common.server import ServiceHost

log = logging.getLogger(__name__)

CONFIG_SCHEMA = BufferServiceConfig
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def keep_large_buffers_in_heap() -> None:
    """glibc gives each buffer above its mmap threshold back to the kernel when it is freed, and the next
    one is faulted in page by page; with multi-megabyte groups that was a third of the cost of moving
    one through the buffer (3.5 MiB groups: 57 -> 83 per second here). No-op without glibc."""
    libc_name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(libc_name), "mallopt", None) if libc_name else None
    if mallopt is None:
        return
    if not (mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) and mallopt(M_TRIM_THRESHOLD, 1024**3)):
        log.warning("could not tune the memory allocator for large groups")


class BufferHost(ServiceHost):
    """A ServiceHost that also owns the buffer core: stopping it closes the write-ahead log."""

    def __init__(self, config: BufferServiceConfig, core: Buffer):
        super().__init__("buffer", config.server)
        self.core = core
        self.add(register, BufferServicer(core, BufferMetrics(self.registry, core)), SERVICE.full_name)

    def stop(self, grace: float | None = None) -> None:
        super().stop(grace)
        self.core.close()


def build(config: BufferServiceConfig) -> BufferHost:
    """Recover the buffer from its write-ahead log and host it; returned not started (call `start()`).

    Raises PromptFileError when the prompt file cannot be used.
    """
    keep_large_buffers_in_heap()
    return BufferHost(config, Buffer(config))
