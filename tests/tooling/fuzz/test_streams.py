"""Streams cancelled midway or cut inside a message: the service answers what it can, keeps no thread for a
stream that is gone, and serves the next caller at once."""

from __future__ import annotations

import pytest

from zerobubble.tooling.fuzz.abuse import cancelled_streams, cut_messages
from zerobubble.tooling.fuzz.targets import SERVICES


def test_cancelled_streams_leave_every_service_serving(services):
    findings = cancelled_streams(services)
    assert not findings, "\n".join(map(str, findings))


@pytest.mark.parametrize("service", SERVICES)
def test_messages_cut_inside_their_frame_get_a_status_and_leave_the_service_serving(services, service):
    findings = cut_messages(services, service)
    assert not findings, "\n".join(map(str, findings))
