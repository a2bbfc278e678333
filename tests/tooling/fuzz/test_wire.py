"""Below the stubs: junk instead of HTTP/2, bodies that are no protobuf message, and connections that open and
say nothing. Each service closes what it cannot read, answers UNKNOWN or INTERNAL to nothing, and serves the next
caller at once."""

from __future__ import annotations

import random

import pytest
from conftest import SEED

from zerobubble.tooling.fuzz.abuse import half_open, junk, undecodable_bodies
from zerobubble.tooling.fuzz.targets import SERVICES


@pytest.mark.parametrize("service", SERVICES)
def test_junk_bytes_are_dropped_and_the_service_goes_on(services, service):
    findings = junk(services, service, random.Random(SEED))
    assert not findings, "\n".join(map(str, findings))


@pytest.mark.parametrize("service", SERVICES)
def test_bodies_that_are_no_message_are_refused_without_internal(services, service):
    findings = undecodable_bodies(services, service, random.Random(SEED))
    assert not findings, "\n".join(map(str, findings))


@pytest.mark.parametrize("service", SERVICES)
def test_half_open_connections_do_not_hold_the_service_up(services, service):
    findings = half_open(services, service)
    assert not findings, "\n".join(map(str, findings))
