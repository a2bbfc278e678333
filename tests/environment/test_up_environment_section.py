"""`zerobubble up`'s `environment:` section: the environment service is part of a run only when the section lists
environments, and the section is checked against the service's schema before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerobubble.common.config import ConfigError, load_config
from zerobubble.tooling.configs import DEMO
from zerobubble.tooling.launcher.config import UpConfig
from zerobubble.tooling.launcher.dry_run import DryRun
from zerobubble.tooling.launcher.run import RunAssets

CALCULATOR = ["environment.environments=[{name: calculator, builtin: calculator, tool_format: compact}]"]


def started(config: UpConfig, tmp_path: Path) -> dict[str, dict]:
    dry = DryRun(config)
    dry.launch(RunAssets(model=Path("(made by up)"), train=tmp_path / "t.jsonl", eval=None))
    return dry.trees


def test_the_service_starts_only_when_the_section_lists_environments(tmp_path):
    assert "environment" not in started(load_config(UpConfig, DEMO), tmp_path)
    no_list = load_config(UpConfig, DEMO, ["environment.limits.step_timeout_s=3"])
    assert not no_list.runs_environments and "environment" not in started(no_list, tmp_path)
    trees = started(load_config(UpConfig, DEMO, CALCULATOR), tmp_path)
    tree = trees["environment"]
    assert tree["environments"] == [{"name": "calculator", "builtin": "calculator", "tool_format": "compact"}]
    # On loopback and behind the run's token, as every service of a run.
    assert tree["server"]["listen"] == "127.0.0.1:0" and tree["server"]["auth_token_env"] == "ZEROBUBBLE_AUTH_TOKEN"
    assert list(trees).index("environment") < list(trees).index("buffer")


def test_a_bad_environment_section_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"environment\.limits\.step_timeout: unknown key"):
        load_config(UpConfig, DEMO, [*CALCULATOR, "environment.limits.step_timeout=3"])
    with pytest.raises(ConfigError, match="environment.environments.0"):
        load_config(UpConfig, DEMO, ["environment.environments=[{name: x, builtin: abacus}]"])
