"""Every Tinker call that does work answers at once with a request id and runs later; the client polls
retrieve_future for the result. One worker thread runs the work in arrival order, so one training client's calls
apply in the order it sent them (the client sends the next only after the server took the previous one). Work
runs to its end whether or not the caller is still there: a client that hangs up loses nothing already accepted,
and its results wait to be fetched (the newest `max_finished`)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from zerobubble.tooling.tinker.errors import Refused, unknown

log = logging.getLogger(__name__)

Result = dict | bytes                     # JSON, or protobuf bytes (wire.PROTO)


@dataclass
class Entry:
    owner: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: Result | None = None
    failure: dict | None = None           # RequestFailedResponse: {"error", "category"}


class Futures:
    def __init__(self, max_pending_per_owner: int, max_finished: int):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-work")
        self._max_pending = max_pending_per_owner
        self._max_finished = max_finished
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._pending: Counter[str] = Counter()

    def submit(self, owner: str, work: Callable[[], Result], *, bounded: bool = True) -> str:
        """Queue `work` for `owner` (a session); 429 when the owner has max_pending_per_session queued (unless
        not `bounded`: the front's own clean-up)."""
        if bounded and self._pending[owner] >= self._max_pending:
            raise Refused(429, "session_id", f"session {owner!r} has {self._pending[owner]} requests queued or "
                          f"running, the most max_pending_per_session allows; retry when some are done")
        request_id = uuid.uuid4().hex
        entry = self._entries[request_id] = Entry(owner)
        self._pending[owner] += 1
        running = asyncio.get_running_loop().run_in_executor(self._executor, _run, work)
        running.add_done_callback(lambda done: self._finish(request_id, entry, done.result()))
        return request_id

    def _finish(self, request_id: str, entry: Entry, outcome: tuple[Result | None, dict | None]) -> None:
        entry.result, entry.failure = outcome
        entry.done.set()
        self._pending[entry.owner] -= 1
        if not self._pending[entry.owner]:
            del self._pending[entry.owner]
        self._finished[request_id] = None
        while len(self._finished) > self._max_finished:
            oldest, _ = self._finished.popitem(last=False)
            self._entries.pop(oldest, None)

    async def wait(self, request_id: str, timeout: float) -> Entry | None:
        """The finished entry, or None when it is still running after `timeout` seconds; 404 for an unknown id."""
        entry = self._entries.get(request_id)
        if entry is None:
            raise unknown("request_id", request_id)
        try:
            await asyncio.wait_for(entry.done.wait(), timeout)
        except TimeoutError:
            return None
        return entry

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _run(work: Callable[[], Result]) -> tuple[Result | None, dict | None]:
    try:
        return work(), None
    except Refused as refused:
        return None, {"error": refused.refusal.message, "category": "user"}
    except Exception as exc:  # a failed request is answered to its caller, never lost in the worker
        log.exception("a Tinker request failed")
        return None, {"error": f"{type(exc).__name__}: {exc}", "category": "server"}
