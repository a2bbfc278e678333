"""Many open streams from one test: grpc.aio calls on an event loop in a thread of their own, so a
thousand streams cost no client threads. Each stream sends its opening request and waits for the
server's headers (so the server is surely serving it: a handler sends them with its first reply, or
at once when it has none to give yet), then stays open, idle, until the block ends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import grpc


class IdleStreams:
    def __init__(self, address: str, method: str, *, client_streaming: bool, metadata: Sequence = ()):
        self.address = address
        self.method = method
        self.client_streaming = client_streaming
        self.metadata = tuple(metadata)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="idle-streams", daemon=True)
        self._channel: grpc.aio.Channel | None = None
        self.calls: list = []

    def run(self, coroutine, timeout: float):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _open_one(self, request: bytes, timeout: float):
        """A stream with a deadline far beyond the test (every call has one); it is cancelled at the end."""
        if self.client_streaming:
            call = self._channel.stream_stream(self.method)(metadata=self.metadata, timeout=timeout)
            await call.write(request)
        else:
            call = self._channel.unary_stream(self.method)(request, metadata=self.metadata, timeout=timeout)
        self.calls.append(call)
        await call.initial_metadata()
        if call.done():
            raise AssertionError(f"{self.method}: the stream ended at once ({await call.code()})")

    async def _open(self, requests: Sequence[bytes], timeout: float) -> None:
        self._channel = grpc.aio.insecure_channel(self.address)
        await asyncio.gather(*(self._open_one(r, timeout) for r in requests))

    @staticmethod
    async def _code(call) -> grpc.StatusCode:
        # A call reports its status once its replies are read.
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError:
            pass
        return await call.code()

    async def _codes(self) -> list[grpc.StatusCode]:
        return await asyncio.gather(*(self._code(call) for call in self.calls))

    def codes(self, timeout: float) -> list[grpc.StatusCode]:
        """How each stream ended (waits until all have)."""
        return self.run(self._codes(), timeout)

    async def _close(self) -> None:
        for call in self.calls:
            call.cancel()
        await self._channel.close()

    def open(self, requests: Sequence[bytes], *, within: float, deadline: float = 3600.0) -> None:
        self._thread.start()
        self.run(self._open(requests, deadline), timeout=within)

    def close(self) -> None:
        if self._channel is not None:
            self.run(self._close(), timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@contextmanager
def idle_streams(address: str, method: str, requests: Sequence[bytes], *, client_streaming: bool,
                 within: float = 120.0, metadata: Sequence = ()) -> Iterator[IdleStreams]:
    """Open one stream per request (serialized bytes); they stay open until the block ends. Fails
    if the server has not taken them all up within `within` seconds."""
    streams = IdleStreams(address, method, client_streaming=client_streaming, metadata=metadata)
    try:
        streams.open(requests, within=within)
        yield streams
    finally:
        streams.close()
