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
