"""Reading a request stream ahead of its handler, so that the next group crosses the network while the
buffer logs the current one.

gRPC's synchronous server asks the transport for the next message only when the handler asks for it,
so without this a push stream alternates between receiving a group and storing it; with a 3.5 MiB
group each half takes milliseconds. A reader thread keeps up to `depth` received groups waiting, which
bounds what a stream holds in memory to `depth + 1` groups.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_END = object()
# How often a reader blocked on a full queue looks whether its consumer went away.
POLL_SECONDS = 0.25


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def read_ahead(source: Iterator[T], depth: int, *, name: str = "read-ahead") -> Iterator[T]:
    """The items of `source` in order, read by a thread that stays at most `depth` items ahead.

    An exception raised by `source` is raised here when its turn comes. Closing the returned generator
    (or dropping it) stops the reader at its next item.
    """
    waiting: queue.Queue = queue.Queue(maxsize=depth)
    stopped = threading.Event()

    def offer(item: object) -> bool:
        while not stopped.is_set():
            try:
                waiting.put(item, timeout=POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for item in source:
                if not offer(item):
                    return
        except BaseException as exc:  # handed to the consumer, which raises it in its own thread
            offer(_Failure(exc))
        else:
            offer(_END)

    reader = threading.Thread(target=read, name=name, daemon=True)
    reader.start()
    try:
        while (item := waiting.get()) is not _END:
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stopped.set()

