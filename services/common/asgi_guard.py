"""http_guard.py's checks for an ASGI app served by uvicorn: `GuardMiddleware` checks Host, Origin and the token
of every HTTP request and WebSocket handshake and reads a body only up to its limit (413 past it), and
`DeadlineH11Protocol` gives the whole request, from its first byte to the end of its body, one deadline
(uvicorn's own timeouts cover only the idle wait between requests). A client that hangs up is not an error: the
middleware answers nothing more to it and logs nothing."""

from __future__ import annotations

import json
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from zerobubble.common.http_guard import Refusal, RequestGuard

log = logging.getLogger(__name__)
_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
              b"content-length: %d\r\n\r\n%s")


class GuardMiddleware:
    def __init__(self, app, guard: RequestGuard, max_body_bytes: int):
        self.app = app
        self.guard = guard
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        refusal = self.guard.check(headers.get)
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send, refusal)
            return
        if refusal is not None:
            await _answer(send, refusal)
            return
        try:
            declared = int(headers.get("content-length", "0"))
        except ValueError:
            await _answer(send, Refusal(400, "Content-Length", "Content-Length: not a number"))
            return
        if declared > self.max_body_bytes:
            await _answer(send, self._too_large())
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left (or its deadline passed): nobody to answer
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body_bytes:
                await _answer(send, self._too_large())
                return
        await self.app(scope, _replay(bytes(body), receive), send)

    def _too_large(self) -> Refusal:
        return Refusal(413, "body", f"the body is over max_body_bytes={self.max_body_bytes}")

    async def _websocket(self, scope, receive, send, refusal: Refusal | None) -> None:
        if refusal is not None:
            await receive()  # websocket.connect
            log.info("WebSocket handshake refused: %s", refusal.message)
            # Closed before it is accepted: the server answers the handshake with 403.
            await send({"type": "websocket.close", "code": 1008, "reason": refusal.message[:120]})
            return
        gone = False

        async def quiet_send(message) -> None:
            nonlocal gone
            if gone:
                return
            try:
                await send(message)
            except OSError:  # uvicorn's ClientDisconnected: the client hung up
                gone = True

        await self.app(scope, receive, quiet_send)


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # only http.disconnect comes after the body

    return replay


async def _answer(send, refusal: Refusal) -> None:
    data = json.dumps({"detail": refusal.message, "field": refusal.field}).encode()
    await send({"type": "http.response.start", "status": refusal.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": data})


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline from a request's first byte (or the end of the previous answer) to
    the end of its body; past it, 408 (when no answer has started) and the connection is closed. Set
    `request_deadline_s` on a subclass (see `deadline_protocol`)."""

    request_deadline_s: float = 10.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._deadline = None
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_deadline_s, self._deadline_passed)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
            self._deadline = None

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._disarm()  # the request is in whole

    def handle_websocket_upgrade(self, event) -> None:
        self._disarm()  # the WebSocket protocol takes the connection over
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            data = json.dumps({"detail": f"the request did not arrive whole within {self.request_deadline_s:g} s",
                               "field": "request"}).encode()
            self.transport.write(_TIMED_OUT % (len(data), data))
        self.transport.close()


def deadline_protocol(request_deadline_s: float) -> type[DeadlineH11Protocol]:
    """The protocol class to give uvicorn (`http=`) for this deadline."""
    return type("DeadlineH11", (DeadlineH11Protocol,), {"request_deadline_s": request_deadline_s})
