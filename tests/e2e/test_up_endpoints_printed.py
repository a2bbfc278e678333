"""What `zerobubble up` prints is all a user needs to reach the run: with the default `openai.listen: 127.0.0.1:0`
and no token of the user's, the console names the OpenAI endpoint's URL with its real port and the file holding the
run's token (readable by its owner only); the openai SDK, given just those, trains an exclusive run to its end,
while a caller without the token is refused."""

from __future__ import annotations

import json
import re
import stat
import urllib.error
import urllib.request

import pytest
from e2e_up import kill_session, start_up, tail, wait_for

from zerobubble.common.config import TOKEN_ENV

PROMPTS, GENERATIONS, MAX_NEW_TOKENS = 4, 2, 8
ENDPOINT_LINE = re.compile(r"OpenAI endpoint of rollout-0: (http://127\.0\.0\.1:(\d+)/v1) ")
TOKEN_LINE = re.compile(r"the run's token .*: (\S+auth-token)$", re.MULTILINE)


def post(url: str, token: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def test_the_printed_url_and_token_file_are_enough_for_the_openai_sdk_to_train_an_exclusive_run(tmp_path,
                                                                                                monkeypatch):
    from openai import AuthenticationError, OpenAI

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    run_dir, output = tmp_path / "run", tmp_path / "up.out"
    up = start_up(run_dir, output, **{
        "task.train_size": PROMPTS, "run.num_generations": GENERATIONS, "run.max_new_tokens": MAX_NEW_TOKENS,
        "trainer.batch.groups_per_step": 2, "rollout.openai.enabled": "true", "rollout.openai.exclusive": "true",
    })
    try:
        found = wait_for(lambda: ENDPOINT_LINE.search(output.read_text()), 300, "the endpoint's line", up, output)
        base_url, port = found.group(1), int(found.group(2))
        assert port != 0
        token_file = wait_for(lambda: TOKEN_LINE.search(output.read_text()), 10, "the token's line", up, output)
        token_path = run_dir / "auth-token"
        assert token_file.group(1) == str(token_path)
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        token = token_path.read_text().strip()
        assert f"zerobubble view {run_dir}" in output.read_text()
        # An exclusive run's waiting line says what it waits for (a line every 15 s without a terminal).
        wait_for(lambda: "training waits for an agent's groups" in output.read_text(), 60, "the waiting line", up,
                 output)

        with pytest.raises(AuthenticationError):
            OpenAI(base_url=base_url, api_key="not-the-token", max_retries=0, timeout=30).models.list()
        assert [m.id for m in OpenAI(base_url=base_url, api_key=token, max_retries=0).models.list()] == [
            "zerobubble-policy"]
        for _ in range(PROMPTS):
            group = post(f"{base_url}/groups", token, {})
            for session_url in group["base_urls"]:
                client = OpenAI(base_url=f"http://127.0.0.1:{port}{session_url}", api_key=token, max_retries=0,
                                timeout=120)
                client.chat.completions.create(model="zerobubble-policy", messages=group["row"]["messages"],
                                               max_tokens=MAX_NEW_TOKENS)
            for session, reward in zip(group["sessions"], [1.0, 0.0], strict=True):
                post(f"{base_url}/sessions/{session}/close", token, {"reward": reward})
        assert up.wait(600) == 0, tail(output)
    finally:
        kill_session(up, run_dir)
    # The token is in its file only: no config, log or record of the run holds it.
    for path in run_dir.rglob("*"):
        if path.is_file() and path != token_path and path.suffix in (".yaml", ".log", ".jsonl", ".json"):
            assert token not in path.read_text(errors="replace"), path
