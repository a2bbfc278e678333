"""The tiny model, made once for the teacher's tests."""

from __future__ import annotations

import pytest

from zerobubble.tooling.tiny.model import make_tiny_model


@pytest.fixture(scope="session")
def teacher_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("teacher") / "model", size="1m", seed=0)
