"""A minimal raw-bytes service for testing the shared bootstrap without any real service."""

from __future__ import annotations

import threading
import time

import grpc

from zerobubble.common.client import ServiceClient
from zerobubble.common.errors import InvalidInput
from zerobubble.common.status import translate_errors

SERVICE = "test.Echo"


class EchoCore:
    def __init__(self):
        self.calls = 0
        self._lock = threading.Lock()

    def echo(self, request: bytes, context) -> bytes:
        with self._lock:
            self.calls += 1
        if request.startswith(b"sleep:"):
            time.sleep(float(request[6:]))
        if request == b"invalid":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "payload: invalid on purpose")
        return request

    @translate_errors
    async def checked(self, request: bytes, context) -> bytes:
        if request == b"invalid":
            raise InvalidInput("invalid on purpose", field="payload")
        return request

    @translate_errors
    async def stream(self, requests, context):
        """Echoes each request; between them it waits, idle, for the next."""
        async for request in requests:
            if request == b"invalid":
                raise InvalidInput("invalid on purpose", field="payload")
            yield request


def register(core: EchoCore, server: grpc.Server) -> None:
    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Echo": grpc.unary_unary_rpc_method_handler(core.echo),
        "Checked": grpc.unary_unary_rpc_method_handler(core.checked),
        "Stream": grpc.stream_stream_rpc_method_handler(core.stream),
    })
    server.add_generic_rpc_handlers((handler,))


class EchoStub:
    def __init__(self, channel: grpc.Channel):
        self.Echo = channel.unary_unary(f"/{SERVICE}/Echo")
        self.Checked = channel.unary_unary(f"/{SERVICE}/Checked")
        self.Stream = channel.stream_stream(f"/{SERVICE}/Stream")


class EchoClient(ServiceClient):
    stub_class = EchoStub
