"""Reading a push stream ahead of its handler: order, the bound on what is held, errors, and stopping."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from zerobubble.buffer.read_ahead import read_ahead


class CountingSource:
    """An endless async iterator that records how many items were taken from it."""

    def __init__(self):
        self.taken = 0

    async def __aiter__(self):
        for i in itertools.count():
            self.taken += 1
            yield i


async def settle() -> None:
    """Let every other task run as far as it can."""
    for _ in range(20):
        await asyncio.sleep(0)


async def collect(source, depth: int) -> list:
    async with read_ahead(source, depth) as items:
        return [item async for item in items]


async def numbers(count: int):
    for i in range(count):
        yield i


def test_items_come_in_order_and_the_end_ends_it():
    assert asyncio.run(collect(numbers(100), 3)) == list(range(100))
    assert asyncio.run(collect(numbers(0), 1)) == []
    assert asyncio.run(collect(numbers(5), 0)) == list(range(5))


def test_the_reader_stays_at_most_depth_items_ahead():
    async def scenario():
        source = CountingSource()
        async with read_ahead(aiter(source), 2) as items:
            assert [await anext(items) for _ in range(3)] == [0, 1, 2]
            await settle()
            # Two items wait in the queue and the reader holds one more, blocked until there is room.
            assert source.taken == 3 + 2 + 1
            assert await anext(items) == 3
            await settle()
            assert source.taken == 4 + 2 + 1

    asyncio.run(scenario())


def test_an_error_of_the_source_is_raised_after_the_items_before_it():
    async def failing():
        yield 1
        yield 2
        raise ConnectionError("the stream broke")

    async def scenario():
        async with read_ahead(failing(), 4) as items:
            assert [await anext(items), await anext(items)] == [1, 2]
            with pytest.raises(ConnectionError, match="the stream broke"):
                await anext(items)

    asyncio.run(scenario())


def test_leaving_the_block_stops_the_reader_and_it_takes_no_more():
    async def scenario():
        source = CountingSource()
        async with read_ahead(aiter(source), 1) as items:
            assert await anext(items) == 0
            await settle()
            assert source.taken == 3
        await settle()
        assert source.taken == 3
        assert len(asyncio.all_tasks()) == 1, "only this one: the reader is gone"

    asyncio.run(scenario())
