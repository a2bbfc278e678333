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
    from zerobubble.common.config import key_tree
    from zerobubble.common.config_tree import key_errors, read_tree
    from zerobubble.environment.config import EnvironmentServiceConfig
    from zerobubble.rollout.config import RolloutServiceConfig
    from zerobubble.teacher.config import TeacherServiceConfig
    from zerobubble.tooling.launcher.config import UpConfig, up_key_tree
    from zerobubble.trainer.config import TrainerServiceConfig

    root = Path(__file__).resolve().parents[2]
    schemas = {"reward": RewardServiceConfig, "buffer": BufferServiceConfig, "rollout": RolloutServiceConfig,
               "trainer": TrainerServiceConfig, "environment": EnvironmentServiceConfig,
               "teacher": TeacherServiceConfig, "demo": UpConfig, "up": UpConfig}
    files = sorted([*configs.DIRECTORY.glob("*.yaml"), *root.glob("deploy/hosts/*.yaml")])
    assert files
    for path in files:
        # A shipped run config (demo, general, a template) is one of `up`'s; a service's is named after it.
        schema = schemas.get(path.stem.split("-")[0], UpConfig if path.parent == configs.DIRECTORY else None)
        assert schema is not None, f"{path.name}: name it after its service"
        load_config(schema, path)
        # Nor refused by the check that runs before the schemas are built.
        assert key_errors(up_key_tree() if schema is UpConfig else key_tree(schema), read_tree(path)) == [], path


def test_a_typo_in_a_list_or_named_entry_gets_the_closest_of_the_entrys_own_keys():
    from zerobubble.environment.config import EnvironmentServiceConfig
    from zerobubble.tooling.launcher.config import UpConfig

    entry = "environments=[{name: calc, builtin: calculator, tool_fromat: compact}]"
    with pytest.raises(ConfigError, match=r"environments\.0\.tool_fromat: unknown key; did you mean tool_format\?"):
        load_config(EnvironmentServiceConfig, overrides=[entry])
    # Under `up` the same entry is named from the run config's root; the suggestion is still the entry's own key.
    with pytest.raises(ConfigError, match=r"environment\.environments\.0\.tool_fromat: unknown key; "
                                          r"did you mean tool_format\?"):
        load_config(UpConfig, overrides=[f"environment.{entry}"])
    # A section inside an entry: the suggestion is written from the entry.
    with pytest.raises(ConfigError, match=r"did you mean openenv\.url\?"):
        load_config(EnvironmentServiceConfig, overrides=["environments=[{name: g, openenv: {url: u, urll: u}}]"])
    # Entries by name (a dict of schemas).
    with pytest.raises(ConfigError, match=r"run\.episodes\.by_data_source\.math\.environmnt: unknown key; "
                                          r"did you mean environment\?"):
        load_config(UpConfig, overrides=["run.episodes.by_data_source={math: {environmnt: calc}}"])
    with pytest.raises(ConfigError, match=r"custom_verifiers\.0\.functon: unknown key; did you mean function\?"):
        load_config(RewardServiceConfig, overrides=["custom_verifiers=[{name: x, function: 'm:f', functon: 1}]"])


def test_a_typo_in_an_optional_section_gets_the_sections_key():
    from zerobubble.tooling.launcher.config import UpConfig

    with pytest.raises(ConfigError, match=r"trainer\.lora\.rnk: unknown key; did you mean trainer\.lora\.rank\?"):
        load_config(UpConfig, overrides=["trainer.lora.rnk=4"])


def _schemas():
    import importlib

    from zerobubble.tooling.launcher.config import UpConfig

    return [UpConfig] + [importlib.import_module(f"zerobubble.{name}.app").CONFIG_SCHEMA
                         for name in ("reward", "buffer", "rollout", "trainer", "environment")]


def test_the_reference_expands_every_nested_schema():
    from zerobubble.common.config import nested_model
    from zerobubble.common.config_reference import describe

    for schema in _schemas():
        parts = {part for name, _, _ in describe(schema) for part in name.replace("[]", "").split(".")}
        # Every field of every schema reachable from this one, entries and optional sections included, has a row.
        reachable, todo = set(), [schema]
        while todo:
            model = todo.pop()
            if model in reachable:
                continue
            reachable.add(model)
            for field_name, field in model.model_fields.items():
                assert field_name in parts, (schema.__name__, model.__name__, field_name)
                inner, _ = nested_model(field.annotation)
                if inner is not None:
                    todo.append(inner)
    environment = {name: default for name, default, _ in describe(_schemas()[-1])}
    assert environment["environments[].tool_format"] == "hermes"
    assert environment["environments[].mcp[].call_timeout_s"] == "5.0"
    trainer = {name: default for name, default, _ in describe(_schemas()[4])}
    assert trainer["lora"] == "null" and trainer["lora.rank"] == "8"
    buffer = {name for name, _, _ in describe(_schemas()[2])}
    assert "run_spec.episodes.by_data_source.NAME.environment" in buffer
