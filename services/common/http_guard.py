"""What every HTTP door of the services checks before it reads a request's body: the Host it was asked as (a
DNS-rebinding page sends its own name), the Origin of a browser page (a page from elsewhere must not drive a local
service) and the bearer token; and, for servers on `http.server`, one deadline for the whole request (head and
body), so that a sender who trickles a byte at a time is cut however often it sends. asgi_guard.py does the same
for the ASGI servers."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True)
class Refusal:
    status: int
    field: str
    message: str


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_name(host: str) -> str:
    """The name of a Host header (or of an Origin's authority), without its port, lowercased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") > 1:  # a bare IPv6 address
        return host
    return host.partition(":")[0].rstrip(".")


class RequestGuard:
    """The checks of one server. Allowed Hosts: the loopback names, the address it listens on, `allowed_hosts`
    ("*": any) and, when it listens on every address, any IP literal (a rebinding page always sends a name).
    Allowed Origins: none sent (not a browser), the server's own (the Host asked), or `allowed_origins` ("*": any).
    The token, when one is set, comes as `Authorization: Bearer TOKEN`, or as Basic credentials whose password is
    the token (what a client given `http://user:TOKEN@host/` sends, openenv-core's WebSocket client included)."""

    def __init__(self, listen_host: str, token: str | None = None, allowed_hosts: Iterable[str] = (),
                 allowed_origins: Iterable[str] = ()):
        bind = host_name(listen_host)
        self._any_ip = bind in _WILDCARDS
        self._hosts = LOOPBACK_NAMES | {host_name(h) for h in allowed_hosts} | ({bind} - _WILDCARDS)
        self._origins = {origin.strip().lower().rstrip("/") for origin in allowed_origins}
        self._token = token.encode() if token else None

    def check(self, header: Callable[[str], str | None]) -> Refusal | None:
        """The first refusal of a request whose headers `header(name)` gives, or None."""
        host = header("host")
        if host is not None and not self.host_allowed(host):
            return Refusal(403, "Host", f"Host: {host[:100]!r} is not a name of this server (a DNS-rebinding page?); "
                                        "allowed_hosts lists others")
        origin = header("origin")
        if origin is not None and not self._origin_allowed(origin, host):
            return Refusal(403, "Origin", f"Origin: a page from {origin[:100]!r} may not call this server; "
                                          "allowed_origins lists the pages that may")
        if self._token is not None and not self._token_matches(header("authorization") or ""):
            return Refusal(401, "Authorization", "missing or wrong bearer token")
        return None

    def host_allowed(self, host: str) -> bool:
        name = host_name(host)
        return "*" in self._hosts or name in self._hosts or (self._any_ip and _is_ip(name))

    def _origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.strip().lower().rstrip("/")
        if "*" in self._origins or origin in self._origins:
            return True
        scheme, _, authority = origin.partition("://")
        return host is not None and scheme in ("http", "https") and authority == host.strip().lower()

    def _token_matches(self, sent: str) -> bool:
        scheme, _, value = sent.strip().partition(" ")
        if scheme.lower() == "basic":
            try:
                value = base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
            except (binascii.Error, UnicodeDecodeError):
                return False
        elif scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(value.strip().encode(), self._token)


class GuardedRequestHandler(BaseHTTPRequestHandler):
    """A handler whose request (its head and its body, read into `self.body`) must arrive whole within
    `request_deadline_s` of the first byte, whose headers pass `guard`, and whose body is at most `max_body_bytes`;
    each refused with `refuse()` before any route runs. When the deadline passes, the reading side of the socket
    is shut, which wakes the blocked read at once."""

    guard: RequestGuard | None = None
    request_deadline_s: float = 10.0
    deadline_setting = "request_deadline_s"  # the setting a 408 names
    max_body_bytes: int = 1024 * 1024
    body: bytes = b""

    def refuse(self, status: int, field: str, message: str) -> None:
        data = json.dumps({"error": {"field": field, "message": message}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_one_request(self) -> None:
        self._late = False
        self._timer = threading.Timer(self.request_deadline_s, self._deadline_passed)
        self._timer.daemon = True
        self._timer.start()
        try:
            super().handle_one_request()
        finally:
            self._timer.cancel()

    def _deadline_passed(self) -> None:
        self._late = True
        try:
            self.connection.shutdown(socket.SHUT_RD)
        except OSError:
            pass  # already closed

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        refusal = self._read_body()
        self._timer.cancel()
        if refusal is None:
            return True
        self.close_connection = True
        self.refuse(refusal.status, refusal.field, refusal.message)
        return False

    def _read_body(self) -> Refusal | None:
        late = Refusal(408, "request", f"the request did not arrive whole within {self.deadline_setting}="
                                       f"{self.request_deadline_s:g} s")
        if self._late:
            return late
        if self.guard is not None and (refusal := self.guard.check(self.headers.get)):
            return refusal
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return Refusal(411, "Content-Length", "Content-Length: needed (chunked bodies are not taken)")
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            return Refusal(400, "Content-Length", "Content-Length: not a number")
        if not 0 <= length <= self.max_body_bytes:
            return Refusal(413, "body", f"the body is over max_body_bytes={self.max_body_bytes}")
        try:
            self.body = self.rfile.read(length)
        except (TimeoutError, ConnectionError):
            return late
        if len(self.body) < length:
            return late if self._late else Refusal(400, "body", "the body ended before Content-Length bytes")
        return None
