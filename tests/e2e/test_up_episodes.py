"""A user's own environment, written as the docs say in a folder outside the repository, trains under `zerobubble up`:
every response is a multi-turn episode whose observation sits between the model's turns, and kill -9 of the
environment service mid-run costs the episodes it held, never an acknowledged group."""

from __future__ import annotations

import json
import os
import signal

from e2e_helpers import FEEDBACK, FEEDBACK_ENVIRONMENT, user_environments
from e2e_up import assert_every_group_accounted_for, kill_session, service_pids, start_up, steps_trained, tail, wait_for

PROMPTS = 32


def test_a_users_environment_trains_under_up_and_survives_kill_9_of_the_environment_service(tmp_path):
    envs = user_environments(tmp_path, "feedback_env", FEEDBACK_ENVIRONMENT)
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    up = start_up(run_dir, output, **{
        "environment.environments": f"[{{name: feedback, environment: 'feedback_env:Feedback', path: '{envs}'}}]",
        "run.episodes.default": "{environment: feedback}", "run.episodes.max_turns": 3,
        "run.episodes.max_turn_tokens": 8, "run.max_new_tokens": 96,
        "trainer.tracking.rollout_log": "{interval_steps: 1, groups: 4}",
    })
    try:
        wait_for(lambda: steps_trained(run_dir) >= 2, 300, "two steps of episodes", up, output)
        os.kill(service_pids(run_dir)["environment"], signal.SIGKILL)
        assert up.wait(600) == 0, tail(output)
    finally:
        kill_session(up, run_dir)
    assert "environment was killed by SIGKILL; restarting environment" in output.read_text(), tail(output)
    assert_every_group_accounted_for(run_dir, PROMPTS)

    logged = [response for line in (run_dir / "trainer" / "rollouts.jsonl").read_text().splitlines()
              for response in json.loads(line)["responses"]]
    episodes = [r["episode"] for r in logged]
    assert all(e["environment"] == "feedback" for e in episodes)
    finished = [r for r in logged if r["episode"]["ended_reason"] == "done"]
    assert len(finished) > len(logged) // 2, [e["ended_reason"] for e in episodes]
    observation = f"<|im_start|>user\n{FEEDBACK}<|im_end|>\n<|im_start|>assistant\n"
    for response in finished:
        # Two turns with the environment's feedback between them, as the chat template renders a user message.
        assert response["episode"]["turns"] == 2 and response["episode"]["step_rewards"][0] == 0.0
        assert observation in response["text"]
        # What the trainer learnt from: the model's two turns; the feedback between them (and the end of the first
        # turn the model did not write itself) masked out, with no behaviour log-prob.
        mask, tokens = response["loss_mask"], response["tokens"]
        masked = "".join(t for t, m in zip(tokens, mask, strict=True) if m == 0)
        # After a turn the model ended itself only the newline its end token leaves; after one cut at
        # max_turn_tokens, the end token too.
        assert masked in ("\n" + observation, "<|im_end|>\n" + observation), masked
        first, second = mask.index(0), len(mask) - mask[::-1].index(0)
        assert 0 < first < second < len(mask) and set(mask[first:second]) == {0}, "one observation between two turns"
        assert all(lp == 0 for lp, m in zip(response["logprobs"], mask, strict=True) if m == 0)
    # Episodes the killed service held end as unavailable; the run went on without them.
    assert {e["ended_reason"] for e in episodes} <= {"done", "unavailable", "max_tokens"}
