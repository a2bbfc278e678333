"""Shared fixtures: labelled data beside the repository, and a real reward service on loopback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The lanes, by where a test lives: `make test-fast` leaves out every test marked e2e, bench, fuzz or slow.
# The peers' own servers and clients (MCP, OpenEnv, the openai client) start slowly: `make test` runs them.
LANE_OF_FOLDER = {"e2e": "e2e", "compose": "e2e", "packaging": "e2e", "e2e_bench": "bench", "fuzz": "fuzz",
                  "peers": "slow"}


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: whole runs, compose, separate hosts or package installs")
    config.addinivalue_line("markers", "bench: runs a benchmark command")
    config.addinivalue_line("markers", "fuzz: soaks every service with generated input")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.fspath)
        lane = "bench" if path.name.startswith("test_bench") else LANE_OF_FOLDER.get(path.parent.name)
        if lane:
            item.add_marker(lane)


SHARED_DATA = Path(os.environ.get("ZEROBUBBLE_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"labelled data not found at {SHARED_DATA} (it sits beside the repository in CI; "
                    "set ZEROBUBBLE_SHARED to its folder)")
    return SHARED_DATA
