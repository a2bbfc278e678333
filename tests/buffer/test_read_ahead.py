"""Reading a push stream ahead of its handler: order, the bound on what is held, errors, and stopping."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from zerobubble.buffer.read_ahead import read_ahead


class CountingSource:
    """An endless iterator that records how many items were taken from it."""

    def __init__(self):
        self.taken = 0
        self.changed = threading.Condition()

    def __iter__(self):
        for i in itertools.count():
            with self.changed:
                self.taken += 1
                self.changed.notify_all()
            yield i

    def wait_for(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.taken >= count, timeout=5), f"only {self.taken} taken"


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "read-ahead"]


def test_items_come_in_order_and_the_end_ends_it():
    assert list(read_ahead(iter(range(100)), 3)) == list(range(100))
    assert list(read_ahead(iter([]), 1)) == []


def test_the_reader_stays_at_most_depth_items_ahead():
    source = CountingSource()
    items = read_ahead(iter(source), 2)
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    # Two items wait in the queue and the reader holds one more, blocked until there is room.
    source.wait_for(3 + 2 + 1)
    time.sleep(0.3)
    assert source.taken == 3 + 2 + 1
    assert next(items) == 3
    source.wait_for(4 + 2 + 1)
    items.close()


def test_an_error_of_the_source_is_raised_after_the_items_before_it():
    def failing():
        yield from (1, 2)
        raise ConnectionError("the stream broke")

    items = read_ahead(failing(), 4)
    assert [next(items), next(items)] == [1, 2]
    with pytest.raises(ConnectionError, match="the stream broke"):
        next(items)


def test_closing_stops_the_reader_and_it_takes_no_more():
    source = CountingSource()
    items = read_ahead(iter(source), 1)
    assert next(items) == 0
    source.wait_for(3)
    items.close()
    deadline = time.monotonic() + 5
    while reader_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not reader_threads()
    assert source.taken == 3
