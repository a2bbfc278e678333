"""A real environment service on a loopback port, shared by the integration tests of this folder."""

from __future__ import annotations

import pytest
from env_helpers import client_of, start_environment


@pytest.fixture(scope="session")
def environment_host():
    host = start_environment()
    yield host
    host.stop(grace=1.0)


@pytest.fixture(scope="session")
def environments(environment_host):
    with client_of(environment_host) as client:
        yield client
