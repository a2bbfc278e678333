"""Bounds on the HTTP side's connections, which aiohttp leaves open: a connection must send its request head
within `http.header_timeout_seconds` of opening (or of its last request), and at most `http.max_connections`
(per client address: `http.max_connections_per_peer`) are held at once. A connection beyond a bound evicts the
oldest one of its scope still waiting for a head (a slow or silent one), or is closed itself, so silent
connections cannot take the process's file descriptors from gRPC and health checks."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from zerobubble.reward.config import HttpConfig

log = logging.getLogger(__name__)


class ConnectionGuard:
    """Watches one aiohttp Server's connections; all of it runs on the server's event loop."""

    def __init__(self, config: HttpConfig):
        self.config = config
        self.evicted = 0
        self._peers: dict[RequestHandler, str] = {}
        self._transports: dict[RequestHandler, asyncio.Transport] = {}
        # Connections waiting for a request head, oldest first, each with the timer that closes it.
        self._waiting: dict[RequestHandler, asyncio.TimerHandle] = {}
        self._per_peer: Counter[str] = Counter()

    def watch(self, server: web.Server) -> None:
        """Hook the server's own connection bookkeeping, which every RequestHandler calls."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._opened(handler, transport)

        def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
            self._closed(handler)
            lost(handler, exc)

        server.connection_made, server.connection_lost = connection_made, connection_lost

    def _opened(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        peer = str((transport.get_extra_info("peername") or ("?",))[0])
        self._peers[handler], self._transports[handler] = peer, transport
        self._per_peer[peer] += 1
        for over, scope in ((len(self._peers) > self.config.max_connections, None),
                            (self._per_peer[peer] > self.config.max_connections_per_peer, peer)):
            if over and not self._evict(scope, handler):
                log.debug("HTTP connection from %s refused: over the connection bound", peer)
                transport.abort()
                return
        self.expect_head(handler, self.config.header_timeout_seconds)

    def _evict(self, peer: str | None, newcomer: RequestHandler) -> bool:
        """Close the oldest connection waiting for its head (of `peer` when given); False if there is none."""
        for handler in self._waiting:
            if handler is not newcomer and (peer is None or self._peers[handler] == peer):
                self.evicted += 1
                self._transports[handler].abort()
                self._forget_wait(handler)
                return True
        return False

    def expect_head(self, handler: RequestHandler, seconds: float) -> None:
        """Close the connection unless a request head arrives within `seconds`."""
        self._forget_wait(handler)
        if handler in self._transports:
            loop = asyncio.get_running_loop()
            self._waiting[handler] = loop.call_later(seconds, self._expire, handler)

    def head_arrived(self, handler: RequestHandler) -> None:
        self._forget_wait(handler)

    def _expire(self, handler: RequestHandler) -> None:
        self._waiting.pop(handler, None)
        transport = self._transports.get(handler)
        if transport is not None:
            transport.abort()

    def _forget_wait(self, handler: RequestHandler) -> None:
        timer = self._waiting.pop(handler, None)
        if timer is not None:
            timer.cancel()

    def _closed(self, handler: RequestHandler) -> None:
        self._forget_wait(handler)
        self._transports.pop(handler, None)
        peer = self._peers.pop(handler, None)
        if peer is not None:
            self._per_peer[peer] -= 1
            if not self._per_peer[peer]:
                del self._per_peer[peer]
