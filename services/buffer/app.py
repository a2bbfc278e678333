"""The buffer as a service: the hooks `zerobubble serve buffer` uses."""

from __future__ import annotations

from zerobubble.buffer.config import BufferServiceConfig
from zerobubble.buffer.core import Buffer
from zerobubble.buffer.metrics import BufferMetrics
from zerobubble.buffer.servicer import SERVICE, BufferServicer, register
from zerobubble.common.allocator import keep_large_buffers_in_heap
from zerobubble.common.server import ServiceHost

CONFIG_SCHEMA = BufferServiceConfig


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
