import pytest

from zerobubble.common.config import ConfigError, ServerConfig, load_config
from zerobubble.reward.config import RewardServiceConfig
from zerobubble.tooling import configs


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


def test_reference_lists_every_field_with_its_real_default():
    from zerobubble.buffer.config import BufferServiceConfig
    from zerobubble.common.config_reference import describe

    reward = {name: default for name, default, _ in describe(RewardServiceConfig)}
    assert reward["server.listen"] == "127.0.0.1:50052"
    assert reward["sandbox.bwrap"] == "bwrap"
    assert reward["rewards.correct"] == "1.0"
    assert len(reward) == len(set(reward)) > 30
    buffer = {name: default for name, default, _ in describe(BufferServiceConfig)}
    assert buffer["prompts.path"] == "(required)" and buffer["server.listen"] == "127.0.0.1:50053"


def test_shipped_config_files_validate():
    from pathlib import Path

    from zerobubble.buffer.config import BufferServiceConfig
    from zerobubble.rollout.config import RolloutServiceConfig
    from zerobubble.tooling.launcher.config import UpConfig
    from zerobubble.trainer.config import TrainerServiceConfig

    root = Path(__file__).resolve().parents[2]
    schemas = {"reward": RewardServiceConfig, "buffer": BufferServiceConfig, "rollout": RolloutServiceConfig,
               "trainer": TrainerServiceConfig, "demo": UpConfig, "up": UpConfig}
    files = sorted([*configs.DIRECTORY.glob("*.yaml"), *root.glob("deploy/hosts/*.yaml")])
    assert files
    for path in files:
        # A shipped run config (demo, general, a template) is one of `up`'s; a service's is named after it.
        schema = schemas.get(path.stem.split("-")[0], UpConfig if path.parent == configs.DIRECTORY else None)
        assert schema is not None, f"{path.name}: name it after its service"
        load_config(schema, path)
