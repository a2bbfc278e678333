"""`zerobubble serve teacher` as a user runs it: a model folder that is not there is refused before torch loads,
naming model.path; a real one is served behind the token from the environment, and SIGTERM ends it cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from teacher_helpers import TOKEN, student_client

from zerobubble.common.config import TOKEN_ENV


def serve(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zerobubble", "serve", "teacher", "--listen", "127.0.0.1:0",
                             "--metrics-port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})


def test_a_model_folder_that_is_not_there_is_refused_naming_the_field(tmp_path):
    process = serve("--set", f"model.path={tmp_path / 'missing'}")
    _, err = process.communicate(timeout=60)
    assert process.returncode != 0
    assert "model.path" in err and "missing" in err
    assert "torch" not in err


# A process importing torch and transformers: 6 to 12 s on 2 busy cores.
@pytest.mark.slow
def test_the_served_teacher_answers_behind_the_token_and_stops_on_sigterm(teacher_model):
    process = serve("--set", f"model.path={teacher_model}", "--set", f"server.auth_token_env={TOKEN_ENV}",
                    env={TOKEN_ENV: TOKEN})
    try:
        ready = json.loads(process.stdout.readline())
        assert ready["service"] == "teacher"
        with student_client(ready["address"], teacher_model) as client:
            assert client.connect().model == str(teacher_model)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
