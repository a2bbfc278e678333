"""The images every test here runs: built once per session (cached by Docker after the first time, or already built
by `make test` beside its other suites). Outside `make test-compose` (ZEROBUBBLE_COMPOSE=1) the tests skip."""

from __future__ import annotations

import os

import pytest
from compose_stack import build_images, torch_wheel_folder


@pytest.fixture(scope="session")
def images() -> None:
    if os.environ.get("ZEROBUBBLE_COMPOSE") != "1":
        pytest.skip("the compose stacks run from `make test-compose` (ZEROBUBBLE_COMPOSE=1)")
    figures = build_images(torch_wheel_folder())
    print("build seconds:", {k: round(v) for k, v in figures.items()})
