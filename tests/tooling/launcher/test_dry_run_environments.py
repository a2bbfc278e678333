"""`up --dry-run` loads the run's environments as their service will, starting nothing: a class that is not
there is refused naming the entry, an OpenEnv server that does not answer is refused naming its URL (an MCP
server's tools listed: tests/peers/test_dry_run_mcp.py)."""

from __future__ import annotations

import json
import socket

from zerobubble.tooling.cli import main

MY_ENVS = '''
print("my_envs imported")  # what a user's module prints is no answer of the check


class Echo:
    def reset(self, row):
        return "hello"

    def step(self, text):
        return {"observation": None, "reward": 0.0, "done": True}
'''


def dry_run(tmp_path, *entries: dict) -> int:
    (tmp_path / "envs").mkdir(exist_ok=True)
    (tmp_path / "envs" / "my_envs.py").write_text(MY_ENVS)
    # The tool demo's episodes play in `calculator`: each case names its entry so.
    return main(["up", "--config", "tool-demo", "--set", f"environment.environments={json.dumps(list(entries))}",
                 "--set", f"run_dir={tmp_path / 'run'}", "--dry-run"])


def test_a_class_that_is_not_there_is_refused_naming_the_entry(tmp_path, capsys):
    entry = {"name": "calculator", "environment": "my_envs:NoSuchClass", "path": str(tmp_path / "envs")}
    assert dry_run(tmp_path, entry) == 2
    assert "environment.environments[calculator]: ImportError: module 'my_envs' has no 'NoSuchClass'" in \
        capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_class_that_loads_is_shown_and_nothing_starts(tmp_path, capsys):
    entry = {"name": "calculator", "environment": "my_envs:Echo", "path": str(tmp_path / "envs")}
    assert dry_run(tmp_path, entry) == 0
    out = capsys.readouterr().out
    assert "environment calculator: my_envs:Echo (reset/step)" in out and "nothing was started" in out
    assert "my_envs imported" not in out, "the user's module ran in the launcher's process"
    assert not (tmp_path / "run").exists()


def test_an_openenv_server_that_does_not_answer_is_refused_naming_its_url(tmp_path, capsys):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    entry = {"name": "calculator", "openenv": {"url": f"http://127.0.0.1:{port}"}}
    assert dry_run(tmp_path, entry) == 2
    err = capsys.readouterr().err
    assert f"environment.environments[calculator]: ValueError: openenv.url: the OpenEnv server at " \
           f"http://127.0.0.1:{port} did not answer GET /health" in err, err
