"""The ids callers name themselves and their work by (worker, producer, prompt ids): one rule for every service, as
they end up in store keys, file names and log lines. torch's TCPStore resets a connection sent a key of 16 KB."""

from __future__ import annotations

from zerobubble.common.errors import InvalidInput, TooLarge

MAX_ID_CHARS = 256


def check_name(value: str, field: str, *, required: bool) -> None:
    """Refuse an id that is empty (when required), longer than MAX_ID_CHARS or not printable, naming `field`."""
    if required and not value:
        raise InvalidInput("must not be empty", field=field)
    if len(value) > MAX_ID_CHARS:
        raise TooLarge(f"{len(value)} characters, over the limit of {MAX_ID_CHARS}", field=field)
    if not value.isprintable():
        raise InvalidInput("must be printable characters only", field=field)
