"""A request the front refuses: the HTTP status and the field at fault, answered as {"detail", "field"} as every
HTTP door of the services answers (common/http_guard.py's Refusal)."""

from __future__ import annotations

from zerobubble.common.http_guard import Refusal


class Refused(Exception):
    def __init__(self, status: int, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.refusal = Refusal(status, field, f"{field}: {message}")


def invalid(field: str, message: str) -> Refused:
    """422: a request the client must change (the client does not retry it)."""
    return Refused(422, field, message)


def unknown(field: str, value: object) -> Refused:
    """404: an id this server never gave out, or one it has already let go."""
    return Refused(404, field, f"{str(value)[:200]!r} is not known to this server")
