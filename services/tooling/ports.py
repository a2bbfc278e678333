"""A port no one listens on, for a service whose address must be written into configs before it starts."""

from __future__ import annotations

import random
import socket

# Below the kernel's ephemeral range (32768-60999 by default), so an outgoing connection made between this probe
# and the service's bind cannot be handed the port: bind(0) draws from that range and lost such races.
_LOW, _HIGH = 20000, 32767


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing is bound to now; drawn at random so concurrent callers rarely pick the same."""
    for _ in range(200):
        port = random.randint(_LOW, _HIGH)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port on {host} between {_LOW} and {_HIGH}")
