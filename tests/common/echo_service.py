"""A minimal raw-bytes service for testing the shared bootstrap without any real service."""

from __future__ import annotations

import threading
import time

import grpc

from zerobubble.common.client import ServiceClient

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


def register(core: EchoCore, server: grpc.Server) -> None:
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(core.echo)}
    )
    server.add_generic_rpc_handlers((handler,))


class EchoStub:
    def __init__(self, channel: grpc.Channel):
        self.Echo = channel.unary_unary(f"/{SERVICE}/Echo")


class EchoClient(ServiceClient):
    stub_class = EchoStub
