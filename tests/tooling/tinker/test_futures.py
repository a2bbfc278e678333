"""The futures every Tinker call answers through, without a server: a session's queue is bounded (429 naming the
session) while other sessions go on, a result waits for a caller that gave up polling, failures come back in the
client's shape, and an id never issued is a 404."""

from __future__ import annotations

import asyncio
import threading

import pytest

from zerobubble.tooling.tinker.errors import Refused, invalid
from zerobubble.tooling.tinker.futures import Futures


def test_a_sessions_queue_is_bounded_and_other_sessions_go_on():
    async def scenario():
        futures = Futures(max_pending_per_owner=2, max_finished=10)
        release = threading.Event()
        held = [futures.submit("a", lambda: {"n": release.wait(10)}) for _ in range(2)]
        with pytest.raises(Refused) as caught:
            futures.submit("a", lambda: {})
        assert (caught.value.refusal.status, caught.value.refusal.field) == (429, "session_id")
        other = futures.submit("b", lambda: {"b": 1})  # queued behind a's, not refused
        release.set()
        assert [(await futures.wait(i, 10)).result for i in held] == [{"n": True}, {"n": True}]
        assert (await futures.wait(other, 10)).result == {"b": 1}
        futures.submit("a", lambda: {})  # a's queue has room again
        futures.close()

    asyncio.run(scenario())


def test_a_result_waits_for_a_caller_that_stopped_polling():
    async def scenario():
        futures = Futures(max_pending_per_owner=4, max_finished=10)
        release = threading.Event()
        request_id = futures.submit("a", lambda: release.wait(10) and b"proto")
        assert await futures.wait(request_id, 0.05) is None  # the poll ends; the work goes on
        release.set()
        await asyncio.sleep(0.2)
        assert (await futures.wait(request_id, 10)).result == b"proto"
        assert (await futures.wait(request_id, 10)).result == b"proto"  # a retried poll gets it again
        futures.close()

    asyncio.run(scenario())


def test_failures_come_back_as_the_client_reads_them():
    def refused():
        raise invalid("data[0].model_input", "no tokens")

    def broken():
        raise RuntimeError("disk full")

    async def scenario():
        futures = Futures(max_pending_per_owner=4, max_finished=10)
        user, server = futures.submit("a", refused), futures.submit("a", broken)
        assert (await futures.wait(user, 10)).failure == {"error": "data[0].model_input: no tokens",
                                                          "category": "user"}
        assert (await futures.wait(server, 10)).failure == {"error": "RuntimeError: disk full", "category": "server"}
        futures.close()

    asyncio.run(scenario())


def test_only_the_newest_results_are_kept_and_unknown_ids_are_404():
    async def scenario():
        futures = Futures(max_pending_per_owner=8, max_finished=2)
        ids = [futures.submit("a", lambda i=i: {"i": i}) for i in range(3)]
        assert (await futures.wait(ids[2], 10)).result == {"i": 2}
        for request_id in (ids[0], "never-issued"):
            with pytest.raises(Refused) as caught:
                await futures.wait(request_id, 1)
            assert (caught.value.refusal.status, caught.value.refusal.field) == (404, "request_id")
        futures.close()

    asyncio.run(scenario())
