"""Calls to a peer service that a worker or trainer keeps retrying while the peer is down or busy: it outlives a
restarting buffer or reward service instead of dying with it, for up to the client's retry_seconds. This is the
only retry of those calls: their clients are built with `retries=False`, so no retry loop nests in another."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection
from typing import TypeVar

import grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

# A peer that is down, restarting or overloaded: worth waiting for. Any other status is a bug to surface.
TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}


class Stopped(Exception):
    """The worker was asked to stop while it waited for a peer."""


def until_done(call: Callable[[], T], *, what: str, stop: threading.Event, max_backoff: float,
               give_up_seconds: float, transient: Collection[grpc.StatusCode] = TRANSIENT) -> T:
    """Retry `call` with capped exponential backoff while the peer is unavailable (its error's status is one of
    `transient`), for at most `give_up_seconds` (then its last error is raised); raise Stopped on stop."""
    backoff = 0.1
    give_up = time.monotonic() + give_up_seconds
    while True:
        if stop.is_set():
            raise Stopped(what)
        try:
            return call()
        except grpc.RpcError as exc:
            if exc.code() not in transient or time.monotonic() >= give_up:
                raise
            log.warning("%s: %s (%s); retrying in %.1f s", what, exc.code().name, exc.details(), backoff)
        if stop.wait(backoff * random.uniform(0.75, 1.25)):
            raise Stopped(what)
        backoff = min(max_backoff, backoff * 2)
