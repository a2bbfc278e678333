"""Reading a request stream ahead of its handler, so that the next group crosses the network while the
buffer logs the current one.

grpc reads a stream's next message only when the handler asks for it, so without this a push stream
alternates between receiving a group and storing it; with a 3.5 MiB group each half takes milliseconds.
A reader task keeps up to `depth` received groups waiting, which bounds what a stream holds in memory to
`depth + 1` groups.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

T = TypeVar("T")

_END = object()


class _Failure:
    def __init__(self, error: Exception):
        self.error = error


@asynccontextmanager
async def read_ahead(source: AsyncIterator[T], depth: int) -> AsyncIterator[AsyncIterator[T]]:
    """`async with read_ahead(source, depth) as items`: the items of `source` in order, read by a task that
    stays at most `depth` items ahead (0: no task, `source` itself). An error of `source` is raised from
    `items` when its turn comes; leaving the block stops the reader."""
    if depth == 0:
        yield source
        return
    waiting: asyncio.Queue = asyncio.Queue(maxsize=depth)

    async def read() -> None:
        try:
            async for item in source:
                await waiting.put(item)
        except Exception as exc:  # handed to the consumer, which raises it in its turn
            await waiting.put(_Failure(exc))
        else:
            await waiting.put(_END)

    async def items() -> AsyncIterator[T]:
        while (item := await waiting.get()) is not _END:
            if isinstance(item, _Failure):
                raise item.error
            yield item

    reader = asyncio.create_task(read())
    try:
        yield items()
    finally:
        reader.cancel()
