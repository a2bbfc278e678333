"""Below the stubs: raw sockets and a raw HTTP/2 client (h2) that send what no gRPC library would, such as
junk bytes, a gRPC message cut short inside its frame, a body that is not a protobuf message, and connections
that open and say nothing."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import h2.config
import h2.connection
import h2.events

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
READ_TIMEOUT_S = 10.0


def _endpoint(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def post_status(address: str, path: str, body: bytes, *, timeout: float) -> int | None:
    """The HTTP status of `body` POSTed to `path` at HOST:PORT on a fresh connection; None when no answer came."""
    # The Host is the address asked (servers that refuse foreign names must still parse the body).
    head = (f"POST {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    try:
        with socket.create_connection(_endpoint(address), timeout=timeout) as conn:
            conn.sendall(head + body)
            parts = conn.makefile("rb").readline().split()
    except OSError:
        return None
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def junk_payloads(rng: random.Random) -> dict[str, bytes]:
    """What a confused or hostile peer might send instead of HTTP/2, by name."""
    # A frame header announcing 16 MiB of DATA on stream 1, followed by far less.
    huge_frame = struct.pack(">I", 0xFFFFFF)[1:] + b"\x00\x00" + struct.pack(">I", 1) + rng.randbytes(64)
    return {
        "random bytes": rng.randbytes(rng.randint(1, 4096)),
        "http/1.1 request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "tls client hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(512),
        "preface then random bytes": HTTP2_PREFACE + rng.randbytes(rng.randint(1, 4096)),
        "preface then a truncated frame": HTTP2_PREFACE + huge_frame,
        "half a preface": HTTP2_PREFACE[:10],
    }


def send_junk(address: str, payload: bytes, *, timeout: float = READ_TIMEOUT_S) -> bytes:
    """Connect, send `payload`, stop sending, and read what comes back until the server closes or `timeout`."""
    received = bytearray()
    with socket.create_connection(_endpoint(address), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        end = time.monotonic() + timeout
        with contextlib.suppress(OSError):
            while time.monotonic() < end:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
    return bytes(received)


@contextlib.contextmanager
def half_open(address: str, count: int, *, opening: bytes = b"",
              timeout: float = READ_TIMEOUT_S) -> Iterator[list[socket.socket]]:
    """`count` TCP connections that open, send `opening` (the HTTP/2 preface, the start of an HTTP request, or
    nothing) and then say nothing."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(_endpoint(address), timeout=timeout)
            sockets.append(sock)
            if opening:
                sock.sendall(opening)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def quiet_http2(address: str, *, open_stream: str | None = None, timeout: float = READ_TIMEOUT_S) -> socket.socket:
    """A connection that completes the HTTP/2 handshake (preface, settings both ways, acknowledged) and opens a
    call to `open_stream` if given, then never sends again: it answers no ping and sends no data. The caller
    watches it with `closed_within`."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    sock = socket.create_connection(_endpoint(address), timeout=timeout)
    try:
        connection.initiate_connection()
        if open_stream is not None:
            connection.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", open_stream),
                                        (":authority", address), ("content-type", "application/grpc"),
                                        ("te", "trailers")])
        sock.sendall(connection.data_to_send())
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"{address} closed the connection during the handshake")
            events = connection.receive_data(chunk)
            # Only the acknowledgement of the server's settings goes back; pings from here on stay unanswered.
            sock.sendall(connection.data_to_send())
            if any(isinstance(event, h2.events.RemoteSettingsChanged) for event in events):
                return sock
        raise TimeoutError(f"{address} sent no HTTP/2 settings within {timeout} s")
    except BaseException:
        sock.close()
        raise


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Reads (and drops) what the server sends without answering it, until it closes the connection: the seconds
    that took, or None if it is still open after `seconds`."""
    started = time.monotonic()
    end = started + seconds
    while (left := end - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return time.monotonic() - started
        except TimeoutError:
            return None
        except OSError:  # reset by the server: closed all the same
            return time.monotonic() - started
    return None


def grpc_frame(payload: bytes) -> bytes:
    """A gRPC length-prefixed message: not compressed, 4-byte big-endian length, the bytes."""
    return b"\x00" + struct.pack(">I", len(payload)) + payload


@dataclass(frozen=True)
class RawAnswer:
    """What the server said on one raw stream: its gRPC status (None when it gave none) and how it ended."""

    status: int | None
    message: str
    ended: str


def raw_call(address: str, path: str, body: bytes, *, close_after: bool = False,
             timeout: float = READ_TIMEOUT_S) -> RawAnswer:
    """One gRPC call over a hand-driven HTTP/2 connection with `body` as the whole request stream (framing
    included, so it can be cut anywhere). The stream is half-closed after it, or with `close_after` the
    connection is dropped instead."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    with socket.create_connection(_endpoint(address), timeout=timeout) as sock:
        connection.initiate_connection()
        stream = connection.get_next_available_stream_id()
        connection.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                         (":authority", address), ("content-type", "application/grpc"),
                                         ("te", "trailers")])
        connection.send_data(stream, body, end_stream=not close_after)
        sock.sendall(connection.data_to_send())
        if close_after:
            return RawAnswer(None, "", "closed by the client")
        headers: dict[str, str] = {}
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                return _answer(headers, "connection closed by the server")
            for event in connection.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    headers.update(dict(event.headers))
                elif isinstance(event, h2.events.DataReceived):
                    connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    return _answer(headers, "stream ended")
                elif isinstance(event, h2.events.StreamReset):
                    return _answer(headers, f"stream reset ({event.error_code!r})")
                elif isinstance(event, h2.events.ConnectionTerminated):
                    return _answer(headers, f"connection terminated ({event.error_code!r})")
            sock.sendall(connection.data_to_send())
        return _answer(headers, "no end within the timeout")


def _answer(headers: dict[str, str], ended: str) -> RawAnswer:
    status = headers.get("grpc-status")
    return RawAnswer(int(status) if status is not None else None, headers.get("grpc-message", ""), ended)


def bytes_call(channel: grpc.Channel, path: str, body: bytes, *, client_streaming: bool, server_streaming: bool,
               timeout: float) -> tuple[grpc.StatusCode, str]:
    """Send `body` as the request message of any RPC (a one-message stream to a streaming one), unparsed; the
    status and its message."""
    kind = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
            (True, False): channel.stream_unary, (True, True): channel.stream_stream}
    method = kind[client_streaming, server_streaming](path)
    try:
        answer = method(iter([body]) if client_streaming else body, timeout=timeout)
        if server_streaming:
            for _ in answer:
                pass
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""
