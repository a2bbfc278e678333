"""Shared fixtures: labelled data beside the repository, and a real reward service on loopback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("ZEROBUBBLE_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"labelled data not found at {SHARED_DATA} (it sits beside the repository in CI; "
                    "set ZEROBUBBLE_SHARED to its folder)")
    return SHARED_DATA
