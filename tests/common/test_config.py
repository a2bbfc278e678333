import pytest

from zerobubble.common.config import ConfigError, ServerConfig, load_config
from zerobubble.reward.config import RewardServiceConfig


def test_defaults_then_yaml_then_overrides(tmp_path):
    path = tmp_path / "reward.yaml"
    path.write_text("server:\n  listen: 0.0.0.0:6000\nmath:\n  workers: 3\n")
    config = load_config(RewardServiceConfig, path, ["math.workers=5", "rewards.correct=10"])
    assert config.server.listen == "0.0.0.0:6000"
    assert config.math.workers == 5
    assert config.rewards.correct == 10.0
    assert config.rewards.wrong == 0.0
    assert config.server.max_message_bytes == ServerConfig().max_message_bytes


def test_unknown_field_is_named(tmp_path):
    path = tmp_path / "reward.yaml"
    path.write_text("math:\n  wrokers: 3\n")
    with pytest.raises(ConfigError, match=r"math\.wrokers"):
        load_config(RewardServiceConfig, path)


def test_bad_value_is_named():
    with pytest.raises(ConfigError, match=r"math\.timeout_seconds"):
        load_config(RewardServiceConfig, overrides=["math.timeout_seconds=-1"])
    with pytest.raises(ConfigError, match=r"server\.listen"):
        load_config(RewardServiceConfig, overrides=["server.listen=nohostport"])


def test_cross_field_check():
    with pytest.raises(ConfigError, match="rewards.correct"):
        load_config(RewardServiceConfig, overrides={"rewards.correct": 0, "rewards.wrong": 1})


def test_malformed_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(RewardServiceConfig, overrides=["math.workers"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(RewardServiceConfig, tmp_path / "nope.yaml")
