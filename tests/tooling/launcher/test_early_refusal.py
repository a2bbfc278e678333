"""The refusal before any schema is built: it says what the schemas' own check says, word for word, refuses nothing
they accept (the shipped configs: tests/common/test_config.py), and reads only a cache made by this code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerobubble.common.config import ConfigError, key_tree, load_config
from zerobubble.common.config_tree import key_errors, read_tree
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.tooling.configs import DEMO
from zerobubble.tooling.launcher import early_refusal
from zerobubble.tooling.launcher.config import UpConfig, up_key_tree

MISTAKES = {
    "a key in a service's section": ["trainer.max_stpes=3"],
    "a key of up's own": ["pipeline.rollout_wokers=2"],
    "a key in a nested section": ["trainer.strategy.optim.lrr=0.1"],
    "a preset": ["run.algorithm=GRPPO"],
    "a key in a list entry": ["environment.environments=[{name: calc, nmae: x}]"],
    "two at once": ["trainer.max_stpes=3", "rollout.generation.top_pp=0.5"],
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_the_early_check_names_a_mistake_as_the_schemas_do(mistake):
    overrides = MISTAKES[mistake]
    with pytest.raises(ConfigError) as full:
        load_config(UpConfig, DEMO, overrides)
    early = key_errors(up_key_tree(), read_tree(DEMO, overrides))
    assert early, f"the early check let {mistake} through"
    assert set(early) <= set(str(full.value).splitlines()[1:]), (early, str(full.value))


def test_values_the_schema_accepts_are_not_refused_early():
    overrides = ["run.algorithm=dapo", "rollout.generation.top_p=0.9", "trainer.lora.rank=8",
                 "environment.environments=[{name: calc, builtin: calculator}]"]
    assert key_errors(up_key_tree(), read_tree(DEMO, overrides)) == []


def test_a_service_section_is_checked_against_that_services_keys_alone():
    rollout = key_tree(RolloutServiceConfig)
    assert key_errors(rollout, {"generation": {"top_pp": 0.5}}) == [
        "  generation.top_pp: unknown key; did you mean generation.top_p?"]


# Runs the command in this interpreter, then reports whether the schemas were built.
PROBE = """
import json, sys
from zerobubble.tooling.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "schemas": "pydantic" in sys.modules}))
"""


def _refuse(argv: list[str], cache: Path) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120,
                         env={**os.environ, early_refusal.CACHE_ENV: str(cache)})
    return json.loads(out.stdout.splitlines()[-1]), out.stderr


@pytest.mark.parametrize("argv", [["up", "--set", "trainer.max_stpes=3"], ["up", "--set", "run.algorithm=GRPPO"],
                                  ["serve", "rollout", "--set", "generation.tmp=1"]])
def test_with_its_cache_made_a_refusal_builds_no_schema_and_says_the_same(argv, tmp_path):
    first, said_first = _refuse(argv, tmp_path)
    assert first["code"] == 2 and first["schemas"], "without a cache the schemas check it"
    assert list(tmp_path.glob("config-keys-*.json")), "the keys were not kept"
    second, said_second = _refuse(argv, tmp_path)
    assert second == {"code": 2, "schemas": False}, said_second
    # Word for word, though the schema may add what only it knows (a required field left out).
    assert said_second.splitlines()[0] == said_first.splitlines()[0]
    assert set(said_second.splitlines()[1:]) <= set(said_first.splitlines()[1:]), (said_second, said_first)


def test_a_missing_model_or_data_set_is_refused_before_any_schema(tmp_path):
    report, said = _refuse(["up", "-m", str(tmp_path / "no-model"), "--set", f"run_dir={tmp_path}/run"], tmp_path)
    assert report == {"code": 2, "schemas": False} and f"model: no such folder {tmp_path}/no-model" in said
    report, said = _refuse(["serve", "buffer", "--set", f"prompts.path={tmp_path}/no.jsonl"], tmp_path)
    assert report == {"code": 2, "schemas": False}
    assert f"prompts.path: {tmp_path}/no.jsonl: cannot read: no such file or folder" in said


def test_a_cache_made_by_other_code_is_not_read(tmp_path, monkeypatch):
    folder = tmp_path / "keys"
    folder.mkdir()
    monkeypatch.setenv(early_refusal.CACHE_ENV, str(folder))
    # Keys that would refuse everything, kept under another fingerprint.
    (folder / "config-keys-0123456789abcdef0123.json").write_text(json.dumps({"up": {"closed": True, "fields": {}}}))
    assert early_refusal.cached_keys("up") is None
    early_refusal.refuse_mistyped("up", "UpConfig", DEMO, [])
    early_refusal.remember_keys("up", up_key_tree())
    assert [p.name for p in folder.iterdir()] == [early_refusal._cache_file().name], "the stale cache was kept"
    assert early_refusal.cached_keys("up") == up_key_tree()
