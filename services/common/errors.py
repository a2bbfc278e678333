"""Errors raised by service cores. Cores know nothing of gRPC; servicers map these to status codes."""

from __future__ import annotations


class ServiceError(Exception):
    """Base: `field` names the offending request field, when there is one."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


class InvalidInput(ServiceError):
    """The request is malformed (INVALID_ARGUMENT)."""


class TooLarge(ServiceError):
    """A part of the request exceeds a configured size limit (RESOURCE_EXHAUSTED)."""


class Overloaded(ServiceError):
    """The service is at capacity; retry later (RESOURCE_EXHAUSTED)."""


class TemporarilyUnavailable(ServiceError):
    """The service cannot do it now but may later, e.g. its disk is full (UNAVAILABLE: worth retrying)."""


class NotFound(ServiceError):
    """The request refers to something that does not exist (NOT_FOUND)."""


class Unavailable(ServiceError):
    """A needed facility is unavailable on this host (FAILED_PRECONDITION)."""


class NotYours(ServiceError):
    """The request is well formed but claims what belongs to another caller (FAILED_PRECONDITION)."""


def check_size(text: str, limit: int, field: str, setting: str) -> None:
    """Raise TooLarge when `text` takes more than `limit` UTF-8 bytes (what the wire and any copy of it cost),
    naming the field and the setting that bounds it."""
    size = len(text.encode())
    if size > limit:
        raise TooLarge(f"{size} bytes exceed the limit of {limit} ({setting})", field)
