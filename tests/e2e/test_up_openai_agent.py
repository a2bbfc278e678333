"""An agent written against the OpenAI SDK trains under `zerobubble up`: the rollout worker generates nothing itself
(rollout.openai.exclusive), the real `openai` client drives a small agent loop (several calls, a tool's result
between them) once per session of every group the endpoint leases, the groups are pushed as their last sessions
close, the trainer steps on them and the run ends by itself; the trainer's rollout log holds, for a group, exactly
the tokens and loss masks the endpoint pushed, which are the tokens the client sent and received."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from e2e_up import kill_session, start_up, steps_trained, tail, wait_for

from zerobubble.common.config import TOKEN_ENV
from zerobubble.tooling.ports import free_port

TOKEN = "agent-run-token"
PROMPTS, GENERATIONS, MAX_NEW_TOKENS = 4, 2, 8


def call(url: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError:
        return 0, {}


def agent(base_url: str, messages: list[dict], calls: int) -> list[dict]:
    """A call, the tool's result, another call...: what the client received of each call."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=120)
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Looks a number up.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    messages, received = list(messages), []
    for turn in range(calls):
        answer = client.chat.completions.create(model="zerobubble-policy", messages=messages, tools=tools,
                                                max_tokens=MAX_NEW_TOKENS)
        received.append(answer.model_extra)
        messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                     {"role": "tool", "content": str(turn + 1)}]
    return received


def test_an_openai_sdk_agent_trains_under_up_and_its_tokens_reach_the_trainer(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    up = start_up(run_dir, output, **{
        "task.train_size": PROMPTS, "run.num_generations": GENERATIONS, "run.max_new_tokens": MAX_NEW_TOKENS,
        "trainer.batch.groups_per_step": 2, "rollout.openai.enabled": "true", "rollout.openai.exclusive": "true",
        "rollout.openai.listen": f"127.0.0.1:{port}",
        "trainer.tracking.rollout_log": "{interval_steps: 1, groups: 2}",
    })
    try:
        wait_for(lambda: call(f"{endpoint}/v1/models")[0] == 200, 300, "the OpenAI endpoint", up, output)
        pushed, received = {}, {}
        for index in range(PROMPTS):
            status, group = call(f"{endpoint}/v1/groups", {})
            assert status == 200, group
            prompt_id = group["row"]["prompt_id"]
            received[prompt_id] = [agent(f"{endpoint}{base_url}", group["row"]["messages"], 3)
                                   for base_url in group["base_urls"]]
            # Rewards that differ, so that no group is filtered for a uniform score; the last group's second
            # session is scored by the arithmetic verifier instead.
            rewards = [1.0, None if index == PROMPTS - 1 else 0.0]
            for session, reward in zip(group["sessions"], rewards, strict=True):
                status, closed = call(f"{endpoint}/v1/sessions/{session}/close", {"reward": reward})
                assert status == 200, closed
            pushed[prompt_id] = closed["group"]
        assert up.wait(600) == 0, tail(output)
    finally:
        kill_session(up, run_dir)
    assert steps_trained(run_dir) >= 1, tail(output)
    # What the client received is what the endpoint pushed: the group's prompt and each trajectory end with the
    # session's last call, token for token, the model's last answer unmasked.
    for prompt_id, group in pushed.items():
        for calls, trajectory in zip(received[prompt_id], group["trajectories"], strict=True):
            last = calls[-1]
            assert group["prompt_ids"] + trajectory["response_ids"] == (last["prompt_token_ids"]
                                                                         + last["completion_token_ids"])
            assert trajectory["loss_mask"][-len(last["completion_token_ids"]):] == [1] * len(
                last["completion_token_ids"])
            assert 0 in trajectory["loss_mask"]
    # And what the trainer trained on is what the endpoint pushed.
    logged = [json.loads(line) for line in (run_dir / "trainer" / "rollouts.jsonl").read_text().splitlines()]
    assert logged, "no group in the rollout log"
    for row in logged:
        group = pushed[row["prompt_id"]]
        assert [(r["token_ids"], r["loss_mask"]) for r in row["responses"]] == [
            (t["response_ids"], t["loss_mask"]) for t in group["trajectories"]]
