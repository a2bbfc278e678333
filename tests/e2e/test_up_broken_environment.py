"""A user's environment whose step raises, under `zerobubble up`: the console shows the exception's message and the
user's own line, each step that trained on nothing is a warning, and the run ends non-zero naming the environment
and the reason after run.episodes.max_failed_batches batches, instead of training on nothing to the end and exiting
0. The counts by reason are in metrics.jsonl, the message in rollouts.jsonl."""

from __future__ import annotations

import json

from e2e_helpers import metrics_rows, user_environments
from e2e_up import kill_session, start_up, tail

BROKEN_ENVIRONMENT = '''
class Broken:
    def reset(self, row):
        return None

    def step(self, assistant_text):
        scores = {}
        return {"observation": None, "reward": scores["missing"], "done": True, "info": {}}
'''


def test_up_on_an_environment_whose_step_raises_stops_non_zero_naming_it_and_shows_the_error(tmp_path):
    envs = user_environments(tmp_path, "broken_env", BROKEN_ENVIRONMENT)
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    up = start_up(run_dir, output, **{
        "environment.environments": f"[{{name: broken, environment: 'broken_env:Broken', path: '{envs}'}}]",
        "run.episodes.default": "{environment: broken}", "run.episodes.max_turn_tokens": 8,
        "run.episodes.max_failed_batches": 4, "run.max_new_tokens": 16,
        "trainer.tracking.rollout_log": "{interval_steps: 1, groups: 1}",
    })
    try:
        code = up.wait(600)
    finally:
        kill_session(up, run_dir)
    console = output.read_text()
    assert code == 1, tail(output)
    # The first error, with the user's line, where the user looks.
    assert "environment 'broken' ended an episode with error (the first of its kind" in console, tail(output)
    assert "step raised KeyError: 'missing'" in console and "broken_env.py" in console, tail(output)
    assert 'scores["missing"]' in console, tail(output)
    # The stop names the environment, the reason and the setting.
    assert "stopped the run: environment 'broken' failed every episode for 4 batches in a row" in console
    assert "run.episodes.max_failed_batches=4" in console, tail(output)
    assert console.count("step raised KeyError") == 2, tail(output)   # the first error and the stop, no more
    # 32 prompts in batches of 4, stopped at the 4th failed batch before it is pushed: at most 3 steps of 4 groups.
    rows = metrics_rows(run_dir)
    assert len(rows) <= 3, rows
    for row in rows:
        assert row["episodes"] == row["episodes_failed"] == row["episodes_failed_error"] == row["samples"]
    # Each step the launcher saw is a warning: the first steps, in order (the trainer may write more while the run
    # stops, after the launcher's last look at its metrics).
    assert "WARNING: step 1 trained on nothing: all 16 of its episodes" in console, tail(output)
    warned = [row for row in rows
              if f"WARNING: step {row['step']} trained on nothing: all {row['episodes']} of its episodes" in console]
    assert warned == rows[:len(warned)], (rows, tail(output))
    if rows:
        logged = [r["episode"] for line in (run_dir / "trainer" / "rollouts.jsonl").read_text().splitlines()
                  for r in json.loads(line)["responses"]]
        assert logged and all("step raised KeyError: 'missing'" in e["error"] for e in logged)
