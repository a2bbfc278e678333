"""`up` with a teacher, checked without starting anything: a run that distils without one is refused naming the
settings that give one; a teacher section makes the dry run start the teacher and hand its address to the
trainer with the run's token."""

from __future__ import annotations

import pytest

from zerobubble.tooling.launcher.config import UpConfig
from zerobubble.tooling.launcher.dry_run import NOWHERE
from zerobubble.tooling.launcher.preflight import check_services


@pytest.mark.parametrize("settings", [{"run": {"algorithm": "DISTILL"}},
                                      {"trainer": {"algorithm": {"distillation_coef": 0.5}}}])
def test_a_run_that_distils_without_a_teacher_is_refused_naming_where_to_give_one(settings):
    with pytest.raises(ValueError, match=r"distils from a teacher: set teacher.model.path .* trainer.teacher.address"):
        UpConfig.model_validate(settings)


def test_a_teacher_section_starts_the_teacher_and_points_the_trainer_at_it(tmp_path):
    config = UpConfig.model_validate({"run_dir": tmp_path / "run", "run": {"algorithm": "DISTILL"},
                                      "teacher": {"model": {"path": str(tmp_path / "teacher")},
                                                  "limits": {"max_sequences": 8}}})
    trees = check_services(config)
    assert trees["teacher"]["limits"] == {"max_sequences": 8}
    assert trees["teacher"]["server"]["auth_token_env"] == trees["trainer"]["teacher"]["auth_token_env"]
    assert trees["trainer"]["teacher"]["address"] == NOWHERE
    assert trees["trainer"]["algorithm"]["preset"] == "DISTILL"
    assert "teacher" not in check_services(UpConfig.model_validate({"run_dir": tmp_path / "other"}))


def test_a_tiny_teacher_is_made_beside_the_student_and_served_as_the_runs_teacher(tmp_path):
    from zerobubble.tooling.launcher.assets import prepare_assets
    from zerobubble.tooling.tiny.model import make_tiny_model

    settings = {"run_dir": tmp_path / "run", "run": {"algorithm": "DISTILL"},
                "task": {"train_size": 8, "eval_size": 2},
                "tiny_model": {"warm_start_steps": 0}, "tiny_teacher": {"warm_start_steps": 2, "seed": 3}}
    config = UpConfig.model_validate(settings)   # no teacher.model.path: the tiny teacher is the run's teacher
    assert config.runs_teacher
    assert str(check_services(config)["teacher"]["model"]["path"]).endswith("teacher")
    assets = prepare_assets(config, tmp_path / "cache")
    assert assets.teacher is not None and assets.teacher != assets.model
    assert "warm2" in assets.teacher.name and "seed3" in assets.teacher.name and "warm0" in assets.model.name
    assert (assets.teacher / "ready.json").exists()
    # Trained further: its weights are not the student's, though both start from the same kind of tiny model.
    untouched = make_tiny_model(tmp_path / "untouched", size="1m", seed=3)
    assert (assets.teacher / "model.safetensors").read_bytes() != (untouched / "model.safetensors").read_bytes()
    # A teacher of the user's own wins over the tiny one.
    own = UpConfig.model_validate({**settings, "teacher": {"model": {"path": str(tmp_path / "own")}}})
    assert prepare_assets(own, tmp_path / "cache").teacher is None


def test_each_routed_data_source_gets_a_teacher_service_of_its_own_and_the_trainer_its_address(tmp_path):
    config = UpConfig.model_validate({
        "run_dir": tmp_path / "run", "run": {"algorithm": "DISTILL"},
        "teacher": {"model": {"path": str(tmp_path / "generalist")}},
        "teachers_by_data_source": {"gsm8k": {"model": {"path": str(tmp_path / "math")}},
                                    "apps": {"model": {"path": str(tmp_path / "code")},
                                             "limits": {"max_sequences": 4}}}})
    trees = check_services(config)
    assert str(trees["teacher"]["model"]["path"]).endswith("generalist")
    assert str(trees["teacher-gsm8k"]["model"]["path"]).endswith("math")
    assert trees["teacher-apps"]["limits"] == {"max_sequences": 4}
    routes = trees["trainer"]["teachers_by_data_source"]
    assert sorted(routes) == ["apps", "gsm8k"]
    assert all(route["address"] == NOWHERE and route["auth_token_env"] == trees["teacher-apps"]["server"]
               ["auth_token_env"] for route in routes.values())


@pytest.mark.parametrize(("settings", "refusal"), [
    ({"run": {"algorithm": "DISTILL"}, "teachers_by_data_source": {"gsm8k": {"model": {"path": "/m"}}}},
     "teachers_by_data_source: the samples of every other data source need the run's teacher too"),
    ({"teacher": {"model": {"path": "/t"}}, "teachers_by_data_source": {"gsm8k": {"model": {"path": "/m"}}}},
     "teachers_by_data_source: teachers score only a run that distils"),
    ({"run": {"algorithm": "DISTILL"}, "teacher": {"model": {"path": "/t"}},
      "teachers_by_data_source": {"gsm8k": {"limits": {"max_sequences": 4}}}},
     r"teachers_by_data_source\.gsm8k\.model"),
    ({"run": {"algorithm": "DISTILL"}, "teacher": {"model": {"path": "/t"}},
      "teachers_by_data_source": {"gsm8k": {"model": {"path": "/m"}}},
      "trainer": {"teachers_by_data_source": {"gsm8k": {"address": "elsewhere:50058"}}}},
     r"teachers_by_data_source\.gsm8k: the run starts this source's teacher and trainer\.teachers_by_data_source"),
    ({"run": {"algorithm": "DISTILL"}, "teacher": {"model": {"path": "/t"}},
      "teachers_by_data_source": {"a/b": {"model": {"path": "/m"}}}},
     r"teachers_by_data_source\.a/b: .* letters, digits"),
])
def test_a_routed_teacher_that_cannot_run_is_refused_naming_the_field(settings, refusal):
    with pytest.raises(ValueError, match=refusal):
        UpConfig.model_validate(settings)


def test_a_teacher_model_that_is_not_there_is_refused_before_anything_is_made(tmp_path):
    from zerobubble.common.config import ConfigError
    from zerobubble.tooling.launcher.preflight import preflight

    def config(**sections):
        return UpConfig.model_validate({"run_dir": tmp_path / "run", "run": {"algorithm": "DISTILL"}, **sections})

    with pytest.raises(ConfigError, match=r"^teacher.model.path: no such folder"):
        preflight(config(teacher={"model": {"path": str(tmp_path / "absent")}}))
    (tmp_path / "made").mkdir()
    (tmp_path / "made" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"^teachers_by_data_source.gsm8k.model.path: no such folder"):
        preflight(config(teacher={"model": {"path": str(tmp_path / "made")}},
                         teachers_by_data_source={"gsm8k": {"model": {"path": str(tmp_path / "absent")}}}))
