"""The first run on one's own model: settings for a real model unless the demo is asked for, shipped configs by
name, and `--dry-run` showing the effective run (what differs from the defaults, where from, what is derived)
without starting anything."""

from __future__ import annotations

import json
import subprocess

import pytest

from zerobubble.common.config import ConfigError
from zerobubble.tooling.cli import main
from zerobubble.tooling.configs import GENERAL, named
from zerobubble.tooling.launcher.commands import up_config
from zerobubble.tooling.launcher.config import UpConfig
from zerobubble.tooling.launcher.run import SMOKE_FLAG

ROW = {"messages": [{"role": "user", "content": "What is 1+1?"}], "gt_answer": "2"}


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({**ROW, "id": i}) + "\n" for i in range(400)))
    return path


@pytest.fixture
def no_children(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)


def parse(*argv: str):
    import argparse

    from zerobubble.tooling.launcher.commands import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["up", *argv])


def test_your_own_model_or_data_starts_from_the_general_default_not_the_demos(rows, tmp_path):
    demo = up_config(parse())
    assert demo.run.max_new_tokens == 16 and demo.run.algorithm == "DR_GRPO"
    for argv in (("-d", str(rows)), ("-m", str(tmp_path)), ("--set", f"model={tmp_path}")):
        config = up_config(parse(*argv))
        assert config.run.max_new_tokens == 512 and config.run.algorithm == "GRPO", argv
        assert config.rollout.get("reward", {}).get("system_prompt") is None, "the verifier's own prompt"
        assert config.trainer["strategy"]["optim"]["lr"] == pytest.approx(1e-6)
    # A config of one's own gets the schema's defaults under it, never the demo's 16 tokens.
    own = tmp_path / "mine.yaml"
    own.write_text(f"train_data: {rows}\n")
    assert up_config(parse("--config", str(own))).run.max_new_tokens == UpConfig().run.max_new_tokens == 256


def test_shipped_configs_are_found_by_name_and_a_wrong_name_lists_them(tmp_path):
    assert named(type(GENERAL)("general")) == GENERAL
    template = up_config(parse("--config", "qwen2.5-0.5b-instruct-gsm8k"))
    assert template.run.verifier == "boxed" and template.run.max_new_tokens == 512
    with pytest.raises(ConfigError, match="no shipped config of that name .*qwen2.5-0.5b-instruct-gsm8k"):
        up_config(parse("--config", "qwen-typo"))


def test_the_tool_demo_plays_every_row_in_the_calculator_it_starts():
    tool_demo = up_config(parse("--config", "tool-demo"))
    assert tool_demo.runs_environments and tool_demo.run.episodes.route(None).environment == "calculator"
    assert [entry["name"] for entry in tool_demo.environment["environments"]] == ["calculator"]
    assert tool_demo.tiny_model.warm_start_tool_use.call == "@calculator({expression})"
    # Without the environment it names, the run is refused before anything starts, naming both sections.
    with pytest.raises(ConfigError, match="run.episodes plays rows in 'calculator', which environment.environments"):
        up_config(parse("--config", "tool-demo", "--set", "environment.environments=[]"))


def test_the_distill_demo_is_the_demo_with_a_teacher_made_here_and_the_distillation_term():
    demo, distill = up_config(parse("--config", "demo")), up_config(parse("--config", "distill-demo"))
    assert distill.runs_teacher and distill.tiny_teacher.warm_start_steps > distill.tiny_model.warm_start_steps
    algorithm = distill.trainer["algorithm"]
    assert algorithm["distillation_coef"] > 0 and algorithm["distillation_discount"] == 1.0
    # Beside RL alone at equal time (the demo from the same student), it must differ from the demo in nothing else:
    # the student made the same way, further warm-started; the same task and run.
    assert distill.tiny_model == demo.tiny_model.model_copy(
        update={"warm_start_steps": distill.tiny_model.warm_start_steps})
    assert distill.tiny_model.warm_start_steps > demo.tiny_model.warm_start_steps
    assert distill.task == demo.task and distill.run == demo.run
    assert distill.run_dir != demo.run_dir


def test_dry_run_shows_each_setting_its_source_and_what_is_derived_and_starts_nothing(rows, tmp_path, capsys,
                                                                                      no_children):
    run_dir = tmp_path / "run"
    code = main(["up", "-d", str(rows), "-lr", "2e-6", "--set", "run.max_new_tokens=300", "--set",
                 f"run_dir={run_dir}", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "(-lr)" in lines["trainer.strategy.optim.lr"] and "2e-06" in lines["trainer.strategy.optim.lr"]
    assert "(--set run.max_new_tokens)" in lines["run.max_new_tokens"]
    assert "(general.yaml)" in lines["trainer.strategy.optim.schedule"]
    # 400 rows x 1 epoch // 16 groups a step = 25 steps of the cosine, derived.
    total = lines["trainer.strategy.optim.total_steps"]
    assert " 25 " in total and "derived" in total
    assert "nothing was started" in out
    assert not run_dir.exists() and not (tmp_path / ".assets").exists()


def test_a_schedule_too_short_for_its_warm_up_is_refused_naming_the_field(tmp_path, capsys, no_children):
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps(ROW) + "\n" for _ in range(40)))
    assert main(["up", "-d", str(few), "--set", f"run_dir={tmp_path / 'run'}", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "trainer.strategy.optim.warmup_steps: the run makes 2 optimizer steps (40 rows x 1 epochs // 16 groups " \
           "a step = 2 steps), no more than its 10 warm-up steps" in err, err


def test_a_smoke_test_cut_short_by_max_steps_is_refused_naming_max_steps_and_the_flag_that_allows_it(
        rows, tmp_path, capsys, no_children):
    argv = ["up", "-d", str(rows), "--set", f"run_dir={tmp_path / 'run'}", "--set", "trainer.max_steps=1", "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    # The data alone gives 25 steps; max_steps made it 1, and the message says so with the right arithmetic.
    assert err.startswith("zerobubble: trainer.max_steps: the run makes 1 optimizer steps (trainer.max_steps=1; "
                          "the data alone gives 400 rows x 1 epochs // 16 groups a step = 25 steps), no more than "
                          "its 10 warm-up steps"), err
    assert SMOKE_FLAG in err
    # The one flag it names makes the smoke test a run.
    assert main([*argv, *SMOKE_FLAG.split()]) == 0
    assert "nothing was started" in capsys.readouterr().out


def test_batches_in_flight_in_a_run_that_takes_weights_only_between_batches_is_refused_naming_both_fields(
        rows, tmp_path, capsys, no_children):
    argv = ["up", "-d", str(rows), "--set", f"run_dir={tmp_path / 'run'}", "--set",
            "rollout.generation.batches_in_flight=2", "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerobubble: rollout.generation.batches_in_flight: 2 batches at once") and \
        "run.weight_updates between_batches" in err, err
    assert main([*argv, "--set", "run.weight_updates=between_turns"]) == 0
