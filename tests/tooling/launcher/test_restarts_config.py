"""The restart policy of `zerobubble up`: a pause that doubles up to a cap, settings checked up front."""

from __future__ import annotations

import pytest

from zerobubble.common.config import ConfigError, load_config
from zerobubble.tooling.launcher.config import RestartsConfig, UpConfig


def test_the_pause_doubles_with_each_restart_up_to_its_cap():
    policy = RestartsConfig(backoff_seconds=1.5, max_backoff_seconds=10.0)
    assert [policy.pause_before(n) for n in range(1, 6)] == [1.5, 3.0, 6.0, 10.0, 10.0]


def test_bad_restart_settings_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="restarts.max_per_service"):
        load_config(UpConfig, None, ["restarts.max_per_service=-1"])
    with pytest.raises(ConfigError, match="restarts.backoff_seconds"):
        load_config(UpConfig, None, ["restarts.backoff_seconds=0"])
    assert load_config(UpConfig, None, ["restarts.max_per_service=0"]).restarts.max_per_service == 0
