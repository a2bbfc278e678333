"""`zerobubble tinker`: a wrong setting is refused naming it, with status 2, before any model
loads."""

from __future__ import annotations

import subprocess
import sys


def test_the_front_refuses_a_wrong_setting_naming_it_before_loading_anything(tmp_path):
    done = subprocess.run([sys.executable, "-m", "zerobubble", "tinker", "--set", "model_name=tiny",
                           "--set", f"model_dir={tmp_path}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "model_dir" in done.stderr and "no Hugging Face model folder" in done.stderr
