"""One home per run setting: each fact of a run is one key of `up`'s config (`run`), every other key that states it
is refused naming that home, and values that follow from others are derived."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerobubble.common.config import ConfigError, load_config
from zerobubble.rollout.config import RolloutServiceConfig
from zerobubble.tooling.configs import DEMO
from zerobubble.tooling.launcher.config import MOVED_KEYS, UpConfig
from zerobubble.tooling.launcher.dry_run import DryRun
from zerobubble.tooling.launcher.run import RunAssets, with_schedule_length
from zerobubble.trainer.config import TrainerServiceConfig


@pytest.mark.parametrize("old", sorted(MOVED_KEYS))
def test_a_run_fact_set_outside_run_is_refused_naming_its_home(old):
    value = {"num_generations": 4} if old == "buffer.run_spec" else 4
    with pytest.raises(ConfigError, match=f"{old} states a fact of the whole run: set {MOVED_KEYS[old]} instead"):
        load_config(UpConfig, DEMO, {old: value})


def test_every_key_a_service_section_states_of_the_run_is_refused():
    # The services' own configs list the fields that state run facts (their expectations of the run spec): in a
    # run config each of those is a second home unless it is refused.
    stated = {f"trainer.{local.split(' ')[0]}" for local, _ in TrainerServiceConfig(model=Path("m")).expectations()
              .values()}
    rollout = RolloutServiceConfig.model_validate({"model": {"path": "m"}})
    stated |= {f"rollout.{local.split(' ')[0]}" for local, _ in rollout.expectations().values()}
    assert stated <= set(MOVED_KEYS), stated - set(MOVED_KEYS)


def test_a_typo_gets_the_closest_key_even_across_sections():
    with pytest.raises(ConfigError, match="pipeline.max_new_token: unknown key; did you mean run.max_new_tokens"):
        load_config(UpConfig, DEMO, ["pipeline.max_new_token=64"])
    with pytest.raises(ConfigError, match="trainer.batch.groups_per_stepp: unknown key; did you mean "
                                          "trainer.batch.groups_per_step"):
        load_config(UpConfig, DEMO, ["trainer.batch.groups_per_stepp=4"])
    with pytest.raises(ConfigError, match="rollout.generation.top_k: Input should be a valid integer"):
        load_config(UpConfig, DEMO, ["rollout.generation.top_k=many"])


def trainer_config_of(config: UpConfig, train: Path) -> TrainerServiceConfig:
    built = {}

    class Capture(DryRun):
        def start(self, name, service, schema, tree, **how):
            if service == "trainer":
                built["trainer"] = schema.model_validate(tree)
            return super().start(name, service, schema, tree, **how)

    Capture(config).launch(RunAssets(model=Path("(made by up)"), train=train, eval=None))
    return built["trainer"]


def test_the_demos_schedule_spans_its_237_steps_and_follows_the_data(tmp_path):
    missing = tmp_path / "not-made-yet.jsonl"   # a dry run before the task is made: the task's size
    demo = load_config(UpConfig, DEMO)
    assert trainer_config_of(demo, missing).strategy.optim.total_steps == 950 * 2 // 8 == 237
    smaller = load_config(UpConfig, DEMO, ["task.train_size=450", "trainer.batch.groups_per_step=4"])
    assert trainer_config_of(smaller, missing).strategy.optim.total_steps == 450 * 2 // 4
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(f'{{"messages": [{{"role": "user", "content": "{i}+1="}}], "gt_answer": "{i + 1}"}}\n'
                            for i in range(40)))
    from_file = load_config(UpConfig, DEMO, [f"train_data={rows}"])
    assert trainer_config_of(from_file, rows).strategy.optim.total_steps == 40 * 2 // 8
    capped = load_config(UpConfig, DEMO, ["trainer.max_steps=100", "trainer.batch.mini_batch_groups=4"])
    assert trainer_config_of(capped, missing).strategy.optim.total_steps == 100 * 2   # two updates a step
    given = load_config(UpConfig, DEMO, ["trainer.strategy.optim.total_steps=500"])
    assert trainer_config_of(given, missing).strategy.optim.total_steps == 500


def test_a_constant_schedule_needs_no_length():
    tree = {"model": "m", "strategy": {"optim": {"schedule": "constant"}}}
    assert with_schedule_length(tree, lambda: pytest.fail("rows were counted"), 1) == tree


def test_the_run_section_reaches_the_buffer_and_the_trainer(tmp_path):
    config = load_config(UpConfig, DEMO, ["run.algorithm=DAPO", "run.max_new_tokens=12"])
    specs = {}

    class Capture(DryRun):
        def start(self, name, service, schema, tree, **how):
            specs[service] = tree
            return super().start(name, service, schema, tree, **how)

    Capture(config).launch(RunAssets(model=Path("(made by up)"), train=tmp_path / "t.jsonl", eval=None))
    assert specs["buffer"]["run_spec"]["algorithm"] == "DAPO" and specs["buffer"]["run_spec"]["max_new_tokens"] == 12
    assert specs["trainer"]["algorithm"]["preset"] == "DAPO"
