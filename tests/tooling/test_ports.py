"""free_port: a port below the ephemeral range that nothing holds, found again when the first draw is taken."""

from __future__ import annotations

import socket

from zerobubble.tooling import ports


def test_a_free_port_is_bindable_and_outside_the_range_outgoing_connections_draw_from():
    port = ports.free_port()
    low_ephemeral = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    assert port < low_ephemeral
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_port_someone_holds_is_passed_over(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.free_port()))
        held.listen()
        taken = held.getsockname()[1]
        draws = iter([taken, taken, taken + 1 if taken < ports._HIGH else taken - 1])
        monkeypatch.setattr(ports.random, "randint", lambda low, high: next(draws))
        assert ports.free_port() != taken
