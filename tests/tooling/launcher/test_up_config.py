"""`zerobubble up` configuration: the demo config, rl_example.py flags and --set, and the README's mapping."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from zerobubble.common.config import ConfigError
from zerobubble.tooling.launcher.commands import register, up_config
from zerobubble.tooling.launcher.config import UpConfig, merge, validated
from zerobubble.tooling.launcher.reference_flags import markdown_table
from zerobubble.trainer.config import TrainerServiceConfig

PEERS_GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "coming-from-peers.md"


# What `up` fills in of the trainer's config itself: the model, and the schedule's length it derives.
DERIVED = {"model": "m", "strategy": {"optim": {"total_steps": 100}}}


def parse(*argv: str):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["up", *argv])


def test_the_demo_config_is_the_default_and_valid():
    config = up_config(parse())
    assert config.run_dir == Path("runs/demo") and config.model is None and config.train_data is None
    trainer = validated(TrainerServiceConfig, merge(DERIVED, config.trainer), "trainer section")
    assert trainer.algorithm.clip_low == pytest.approx(0.2)


def test_reference_flags_land_on_the_configuration():
    config = up_config(parse("-m", "/models/q", "-d", "train.jsonl", "-g", "4", "-a", "DAPO", "-lr", "1e-5",
                             "-tbs", "4", "-tMbs", "2", "-i", "2", "-mnt", "64", "-e", "3", "-p", "exp1",
                             "-ed", '{"math": "eval.jsonl"}', "-rt", "think_answer_tags", "-kl", "0.05"))
    assert config.model == Path("/models/q") and config.train_data == Path("train.jsonl")
    assert config.eval_data == Path("eval.jsonl") and config.run_dir == Path("runs/exp1")
    assert config.run.num_generations == 4 and config.pipeline.rollout_workers == 2
    assert config.run.max_new_tokens == 64 and config.buffer["prompts"]["epochs"] == 3
    assert config.run.verifier == "think_answer_tags" and config.run.algorithm == "DAPO"
    trainer = validated(TrainerServiceConfig, merge({**DERIVED, "algorithm": {"preset": config.run.algorithm}},
                                                    config.trainer), "trainer section")
    assert trainer.algorithm.clip_high == pytest.approx(0.28)  # the DAPO preset
    assert trainer.algorithm.beta == pytest.approx(0.05)
    assert trainer.strategy.optim.lr == pytest.approx(1e-5)
    assert trainer.batch.groups_per_step == 4 and trainer.batch.mini_batches == 2


def test_set_overrides_come_last_and_bad_fields_are_named():
    config = up_config(parse("-g", "4", "--set", "run.num_generations=6"))
    assert config.run.num_generations == 6
    with pytest.raises(ConfigError, match="run.num_generations"):
        up_config(parse("--set", "run.num_generations=1"))
    assert up_config(parse("-t", "2")).trainer_processes == 2
    with pytest.raises(ConfigError, match="trainer_processes"):
        up_config(parse("--set", "trainer_processes=0"))
    with pytest.raises(ConfigError, match="batch"):
        validated(TrainerServiceConfig, {"model": "m", "batch": {"groups_per_step": 3, "mini_batch_groups": 2}},
                  "trainer section")


def test_a_task_asking_more_questions_than_exist_is_refused_before_anything_runs():
    assert up_config(parse("--set", "task.max_operand=99", "--set", "task.operations=+",
                           "--set", "task.train_size=9950")).task.train_size == 9950
    with pytest.raises(ConfigError, match="task.*distinct questions"):
        up_config(parse("--set", "task.max_operand=9", "--set", "task.operations=+", "--set", "task.operands=2",
                        "--set", "task.train_size=90"))
    # A third operand makes a thousand sums of single digits.
    assert up_config(parse("--set", "task.max_operand=9", "--set", "task.operations=+", "--set", "task.operands=3",
                           "--set", "task.train_size=950")).task.train_size == 950
    with pytest.raises(ConfigError, match="task.operands"):
        up_config(parse("--set", "task.operands=1"))
    with pytest.raises(ConfigError, match="task.operations"):
        up_config(parse("--set", "task.operations=x"))


def test_resume_reads_the_runs_own_config(tmp_path):
    with pytest.raises(ConfigError, match="no run there"):
        up_config(parse("--resume", str(tmp_path)))
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "up.yaml").write_text(f"run_dir: {tmp_path}\nrun:\n  num_generations: 5\n")
    config = up_config(parse("--resume", str(tmp_path)))
    assert isinstance(config, UpConfig) and config.run.num_generations == 5


def test_the_docs_have_the_flag_mapping_table():
    assert markdown_table() in PEERS_GUIDE.read_text()
