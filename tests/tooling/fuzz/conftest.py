"""One deployment of every service for the whole fuzz suite; a service that died in one test is restarted for the
next, so one crash fails one test, not all that follow."""

from __future__ import annotations

import os

import pytest

from zerobubble.tooling.fuzz.targets import Deployment

# ZEROBUBBLE_FUZZ_SEED picks other messages than the ones every run sends by default.
SEED = int(os.environ.get("ZEROBUBBLE_FUZZ_SEED", "0"))


@pytest.fixture(scope="session")
def deployment(tmp_path_factory):
    started = Deployment(tmp_path_factory.mktemp("fuzz"))
    yield started
    started.close()


@pytest.fixture
def services(deployment):
    deployment.revive()
    return deployment
