"""Shared fixtures: labelled data beside the repository, and a real reward service on loopback."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# No test reads or writes the user's caches: Hugging Face's (load_dataset builds Arrow files there) is a folder of
# the session's own, set before anything imports `datasets`, and the processes tests start inherit it.
HF_HOME = tempfile.mkdtemp(prefix="zerobubble-tests-hf-")
atexit.register(shutil.rmtree, HF_HOME, ignore_errors=True)
os.environ["HF_HOME"] = HF_HOME
for _variable in ("HF_DATASETS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):
    os.environ.pop(_variable, None)
# Nor zerobubble's own: the config keys `up` and `serve` keep to refuse a mistyped key early.
os.environ["ZEROBUBBLE_CACHE"] = os.path.join(HF_HOME, "zerobubble")

# The lanes, by where a test lives: `make test-fast` leaves out every test marked e2e, bench, fuzz or slow.
# The peers' own servers and clients (MCP, OpenEnv, the openai client) start slowly: `make test` runs them.
LANE_OF_FOLDER = {"e2e": "e2e", "compose": "e2e", "packaging": "e2e", "bench": "bench", "fuzz": "fuzz",
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
