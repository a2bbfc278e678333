"""A service that fails to start: the console shows what its log says (not only where the log is), and a new run
that failed to start leaves its folder free for the next try, its logs kept."""

from __future__ import annotations

import pytest

from zerobubble.tooling.launcher import run as run_module
from zerobubble.tooling.launcher.assets import RunAssets
from zerobubble.tooling.launcher.config import UpConfig, write_yaml
from zerobubble.tooling.launcher.processes import ServiceFailed, ServiceProcess, first_error_lines
from zerobubble.tooling.launcher.run_folder import check_fresh, holds_run


def test_a_service_that_exits_before_serving_is_reported_with_its_logs_error(tmp_path):
    config = write_yaml(tmp_path / "reward.yaml", {"math": {"wrokers": 2}})
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "reward.log").write_text("an earlier start's output\nERROR: an earlier failure\n")
    with pytest.raises(ServiceFailed) as failed:
        ServiceProcess("reward", "reward", config, logs).start(timeout=60)
    message = str(failed.value)
    assert "reward exited with code 2 before serving" in message and str(logs / "reward.log") in message
    # This start's own error, naming the key, and not what an earlier start left in the same log.
    assert "math.wrokers: unknown key" in message and "earlier" not in message, message


def test_a_traceback_shows_whole_up_to_its_exception_and_a_long_one_keeps_its_end():
    text = "INFO starting\nTraceback (most recent call last):\n  File \"a.py\", line 1\n    x()\nValueError: bad\nbye\n"
    assert first_error_lines(text) == ["Traceback (most recent call last):", '  File "a.py", line 1', "    x()",
                                       "ValueError: bad"]
    long = "Traceback (most recent call last):\n" + "  frame\n" * 40 + "KeyError: 'x'\n"
    shown = first_error_lines(long)
    assert len(shown) == 15 and shown[0].startswith("Traceback") and shown[-1] == "KeyError: 'x'"
    assert first_error_lines("one\ntwo\n") == ["one", "two"], "no error line: the last lines"


def test_a_failed_start_leaves_the_folder_free_for_the_next_try(tmp_path, monkeypatch, capsys):
    config = UpConfig(run_dir=tmp_path / "run")

    def failing_launch(self, assets):
        # What a start writes before a service fails: configs, logs, the buffer's log, the trainer's folder.
        write_yaml(self.run_dir / "configs" / "reward.yaml", {})
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs" / "environment.log").write_text("ERROR: no module my_envs\n")
        (self.run_dir / "buffer-wal").mkdir()
        (self.run_dir / "trainer").mkdir()
        raise ServiceFailed("environment exited with code 2 before serving")

    monkeypatch.setattr(run_module, "prepare_assets", lambda *a: RunAssets(tmp_path, tmp_path / "t.jsonl", None))
    monkeypatch.setattr(run_module.Run, "launch", failing_launch)
    assert run_module.up(config) == 1
    out = capsys.readouterr().out
    assert "environment exited with code 2" in out and "free for the next try" in out
    assert not holds_run(config.run_dir)
    assert (config.run_dir / "logs" / "environment.log").read_text() == "ERROR: no module my_envs\n"
    check_fresh(config, overwrite=False)  # no --overwrite needed

    # A resumed run's failed start keeps everything: the folder is its run.
    write_yaml(config.run_dir / "configs" / "up.yaml", {})
    assert run_module.up(config, resume=True) == 1
    assert holds_run(config.run_dir) and "free for the next try" not in capsys.readouterr().out
