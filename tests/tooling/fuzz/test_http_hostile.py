"""The reward service's HTTP side under the fuzz: slow and silent connections are closed within their timeouts
while the service answers, and hostile JSON (deep nesting, huge numbers, cut and mutated documents) gets a 4xx."""

from __future__ import annotations

import random

from conftest import SEED

from zerobubble.tooling.fuzz.http_abuse import hostile_json, slow_connections


def test_slow_http_connections_are_closed_and_the_service_goes_on(services):
    findings = slow_connections(services)
    assert not findings, "\n".join(map(str, findings))


def test_hostile_json_is_answered_4xx(services):
    findings = hostile_json(services, random.Random(SEED))
    assert not findings, "\n".join(map(str, findings))
