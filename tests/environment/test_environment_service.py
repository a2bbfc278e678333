"""The environment service through a real running server (real sockets, real episode processes): episodes of a
user's environment and of the built-ins, every way an environment can fail ending its episode with a stable reason
while the service goes on, and bad requests answered with the right status naming the field."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request

import grpc
import pytest
from env_helpers import client_of, start_environment

from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import ClientConfig, ConfigError, load_config
from zerobubble.environment.app import build
from zerobubble.environment.config import EnvironmentServiceConfig

ROW = {"messages": [{"role": "user", "content": "Guess."}], "ground_truth": "42", "data_source": "test"}


def metrics(host) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{host.metrics_port}/metrics", timeout=5).read().decode()


def ended(host, environment: str, reason: str) -> float:
    line = f'zerobubble_environment_episodes_ended_total{{environment="{environment}",reason="{reason}"}} '
    return next((float(row[len(line):]) for row in metrics(host).splitlines() if row.startswith(line)), 0.0)


def host_pids_started_at(ticks: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        if entry.isdigit() and int(fields[19]) == ticks and "python" in open(f"/proc/{entry}/comm").read():
            found.append(int(entry))
    return found


def gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_the_environments_are_listed_with_their_tools(environments):
    listed = {info.name: info for info in environments.list_environments().environments}
    assert {"calculator", "guess", "add", "add_tools", "hangs"} <= set(listed)
    calculator = json.loads(listed["calculator"].tools_json)
    assert calculator[0]["function"]["name"] == "calculator" and listed["calculator"].tool_format == "hermes"
    assert [tool["function"]["name"] for tool in json.loads(listed["add"].tools_json)] == ["add", "shout", "broken"]
    assert json.loads(listed["guess"].tools_json) == [] and listed["guess"].tool_format == ""


def test_a_users_environment_plays_an_episode(environment_host, environments):
    opened = environments.open_episode("guess", ROW)
    assert json.loads(opened.opening_json) == " Guess my number between 1 and 100."
    assert json.loads(opened.tools_json) == []
    first = environments.step_episode(opened.episode_id, "50")
    assert (json.loads(first.observation_json), first.done, first.ended_reason) == (
        [{"role": "user", "content": "lower"}], False, "")
    last = environments.step_episode(opened.episode_id, "I say 42")
    assert (last.reward, last.done, json.loads(last.info_json), last.ended_reason) == (1.0, True, {"guesses": 2}, "")
    with pytest.raises(grpc.RpcError) as after:
        environments.step_episode(opened.episode_id, "42")
    assert after.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "has ended (done)" in after.value.details()
    environments.close_episode(opened.episode_id)
    environments.close_episode(opened.episode_id)  # twice changes nothing
    with pytest.raises(grpc.RpcError) as closed:
        environments.step_episode(opened.episode_id, "42")
    assert closed.value.code() == grpc.StatusCode.NOT_FOUND and "episode_id" in closed.value.details()


def test_the_calculator_environment_runs_hermes_calls_and_scores_the_final_answer(environments):
    opened = environments.open_episode("calculator", ROW)
    assert json.loads(opened.tools_json)[0]["function"]["name"] == "calculator"
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
    step = environments.step_episode(opened.episode_id, f"Let me compute. {call}")
    assert json.loads(step.observation_json) == [{"role": "tool", "name": "calculator", "content": "42"}]
    assert (step.tool_calls, step.done, step.reward) == (1, False, 0.0)
    final = environments.step_episode(opened.episode_id, "The answer is 42.")
    assert (final.done, final.reward, final.tool_calls, final.ended_reason) == (True, 1.0, 0, "")
    environments.close_episode(opened.episode_id)


def test_a_malformed_call_is_an_observation_and_the_episode_goes_on(environments):
    opened = environments.open_episode("calc_compact", ROW)
    step = environments.step_episode(opened.episode_id, "@calculator(6*7 @nothing(1)")
    observation = json.loads(step.observation_json)
    assert not step.done and "no closing parenthesis" in observation[0]["content"]
    step = environments.step_episode(opened.episode_id, "@calculator(1/0)")
    assert json.loads(step.observation_json)[0]["content"] == "error: CalculatorError: division by zero"
    final = environments.step_episode(opened.episode_id, "42")
    assert (final.done, final.reward) == (True, 1.0)


def test_users_tools_in_a_class_and_in_the_tools_builtin(environments):
    opened = environments.open_episode("add", {"ground_truth": "5"})
    assert json.loads(opened.opening_json) == [{"role": "system", "content": "Use the tools."}]
    calls = ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
             '<tool_call>{"name": "broken", "arguments": {"x": 1}}</tool_call>'
             '<tool_call>{"name": "missing", "arguments": {}}</tool_call>')
    step = environments.step_episode(opened.episode_id, calls)
    contents = [message["content"] for message in json.loads(step.observation_json)]
    assert contents[0] == "5" and contents[1] == "error: RuntimeError: the tool broke"
    assert contents[2].startswith("error: no tool 'missing'")
    assert step.tool_calls == 3 and not step.done
    assert environments.step_episode(opened.episode_id, "5").reward == 1.0

    opened = environments.open_episode("add_tools", {"ground_truth": "9"})
    step = environments.step_episode(opened.episode_id, '<tool_call>{"name": "calculator", "arguments": '
                                                        '{"expression": "4+5"}}</tool_call>')
    assert json.loads(step.observation_json)[0]["content"] == "9"
    assert environments.step_episode(opened.episode_id, "\\boxed{9}").reward == 1.0


def test_the_python_tool_runs_programs_in_the_sandbox(environment_host, environments):
    if "python" not in {info.name for info in environments.list_environments().environments}:
        pytest.skip(f"the code sandbox is off here: {environment_host.core.unavailable.get('python')}")
    opened = environments.open_episode("python", ROW)
    step = environments.step_episode(opened.episode_id, "@python(import os; print(6*7, os.getuid() != 0))")
    assert json.loads(step.observation_json)[0]["content"] == "42 True\n"
    step = environments.step_episode(opened.episode_id, "@python(print(open('/etc/hostname').read()))")
    assert "FileNotFoundError" in json.loads(step.observation_json)[0]["content"]


def test_a_hanging_environment_is_killed_at_its_time_limit_and_others_go_on(environment_host, environments):
    hung = environments.open_episode("hangs", {})
    info = json.loads(environments.step_episode(hung.episode_id, "hello").info_json)
    [pid] = host_pids_started_at(info["started"])  # its pid in the host's view (it may run in a namespace)
    before = ended(environment_host, "hangs", "timeout")
    result = {}
    thread = threading.Thread(target=lambda: result.update(step=environments.step_episode(hung.episode_id, "hang")))
    started = time.monotonic()
    thread.start()
    # While one episode hangs, another is answered.
    other = environments.open_episode("guess", ROW)
    assert environments.step_episode(other.episode_id, "42").done
    assert thread.is_alive(), "the other episode was answered only after the hung step"
    thread.join(30)
    step = result["step"]
    assert (step.done, step.ended_reason) == (True, "timeout") and "limits.step_timeout_s" in step.info_json
    assert 1.9 < time.monotonic() - started
    assert gone(pid), f"the hung episode's process {pid} is still there"
    assert ended(environment_host, "hangs", "timeout") == before + 1


@pytest.mark.parametrize(("environment", "text", "reason", "says"), [
    ("raises", "x", "error", "ValueError: the environment broke"),
    ("exits", "x", "exited", "exited"),
    ("garbage", "x", "bad_reply", "must return a dict"),
    ("garbage", "object", "bad_reply", "observation must be"),
    ("garbage", "nan", "bad_reply", "finite number"),
    ("huge", "x", "observation_too_large", "limits.max_observation_bytes"),
])
def test_a_failing_environment_ends_its_episode_with_a_stable_reason(environment_host, environments, environment,
                                                                      text, reason, says):
    before = ended(environment_host, environment, reason)
    opened = environments.open_episode(environment, {})
    step = environments.step_episode(opened.episode_id, text)
    assert (step.done, step.ended_reason, step.reward) == (True, reason, 0.0)
    assert says in json.loads(step.info_json)["error"]
    assert ended(environment_host, environment, reason) == before + 1
    # The service goes on.
    assert environments.step_episode(environments.open_episode("guess", ROW).episode_id, "42").done


@pytest.mark.parametrize(("text", "reason"), [("not_json", "bad_reply"), ("huge", "observation_too_large"),
                                             ("wrong_shape", "bad_reply"), ("bad_code", "bad_reply")])
def test_the_service_checks_what_an_episodes_process_sends_itself(environments, text, reason):
    opened = environments.open_episode("forger", {})
    step = environments.step_episode(opened.episode_id, text)
    assert (step.done, step.ended_reason) == (True, reason)


def test_the_service_answers_health_checks_and_reflection(environment_host):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(environment_host.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert "zerobubble.v1.EnvironmentService" in ProtoReflectionDescriptorDatabase(channel).get_services()


def test_an_environment_that_never_says_done_ends_after_max_steps(environments):
    opened = environments.open_episode("never_done", {})
    replies = [environments.step_episode(opened.episode_id, "more") for _ in range(5)]
    assert [r.done for r in replies] == [False] * 4 + [True]
    assert replies[-1].ended_reason == "max_steps" and replies[-1].reward == pytest.approx(0.1)


def test_a_reset_that_fails_refuses_the_open_with_its_reason(environments):
    with pytest.raises(grpc.RpcError) as failed:
        environments.open_episode("reset_fails", {})
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "reset_fails" in failed.value.details() and "KeyError" in failed.value.details()


def test_a_reset_that_hangs_is_killed_at_its_time_limit(environment_host, environments):
    before = ended(environment_host, "hangs", "timeout")
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as failed:
        environments.open_episode("hangs", {"hang_in_reset": True})
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "(timeout)" in failed.value.details()
    assert 1.9 < time.monotonic() - started
    assert ended(environment_host, "hangs", "timeout") == before + 1


def test_closing_an_episode_mid_step_ends_that_step_with_exited(environments):
    hung = environments.open_episode("hangs", {})
    result = {}
    thread = threading.Thread(target=lambda: result.update(step=environments.step_episode(hung.episode_id, "hang")))
    thread.start()
    time.sleep(0.5)
    environments.close_episode(hung.episode_id)
    thread.join(30)
    assert (result["step"].done, result["step"].ended_reason) == (True, "exited")


def test_bad_requests_get_the_right_status_naming_the_field(environments):
    def status(call):
        with pytest.raises(grpc.RpcError) as caught:
            call()
        return caught.value.code(), caught.value.details()

    code, details = status(lambda: environments.open_episode("nowhere", ROW))
    assert code == grpc.StatusCode.NOT_FOUND and "'nowhere'" in details and "environment" in details
    raw = environments.stub.OpenEpisode
    for row_json, says in [("{not json", "not JSON"), ("[1, 2]", "JSON object"),
                           ('{"messages": [{"role": "user"}]}', "content"),
                           ('{"n": ' + "1" * 5000 + "}", "not JSON")]:
        with pytest.raises(grpc.RpcError) as caught:
            raw(_open_request("guess", row_json), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details().startswith("row_json") and says in caught.value.details()
    code, details = status(lambda: environments.step_episode("no-such-episode", "hi"))
    assert code == grpc.StatusCode.NOT_FOUND and "episode_id" in details
    opened = environments.open_episode("guess", ROW)
    code, details = status(lambda: environments.step_episode(opened.episode_id, "x" * (1024 * 1024 + 1)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and details.startswith("assistant_text")
    environments.close_episode(opened.episode_id)


def _open_request(environment: str, row_json: str):
    from zerobubble.v1 import environment_pb2

    return environment_pb2.OpenEpisodeRequest(environment=environment, row_json=row_json)


def test_episodes_over_the_limit_are_refused_idle_ones_expire_and_none_gets_the_token(monkeypatch):
    monkeypatch.setenv("ENVIRONMENT_TEST_TOKEN", "secret")
    monkeypatch.setenv("ENVIRONMENT_TEST_PASSED", "yes")
    host = start_environment(**{"limits.max_episodes": 2, "limits.idle_timeout_s": 1.0,
                                "server.auth_token_env": "ENVIRONMENT_TEST_TOKEN",
                                "workers.env": ["ENVIRONMENT_TEST_PASSED"]})
    try:
        with EnvironmentClient(ClientConfig(address=host.address, auth_token_env="ENVIRONMENT_TEST_TOKEN",
                                            timeout_seconds=30, retry_seconds=5)) as client:
            first = client.open_episode("guess", ROW)
            hangs = client.open_episode("hangs", {})
            seen = json.loads(client.step_episode(hangs.episode_id, "hello").info_json)["environment"]
            assert "ENVIRONMENT_TEST_PASSED" in seen and "ENVIRONMENT_TEST_TOKEN" not in seen
            with pytest.raises(grpc.RpcError) as full:
                client.open_episode("guess", ROW)
            assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "limits.max_episodes" in full.value.details()
            time.sleep(3.0)
            with pytest.raises(grpc.RpcError) as expired:
                client.step_episode(first.episode_id, "42")
            assert expired.value.code() == grpc.StatusCode.NOT_FOUND
            assert ended(host, "guess", "expired") == 1 and host.core.live() == 0
            assert client.step_episode(client.open_episode("guess", ROW).episode_id, "42").done
    finally:
        host.stop(grace=1.0)


def test_the_parent_of_the_episode_processes_is_started_again_after_kill_9(environment_host, environments):
    processes = environment_host.core.processes
    before = processes.restarts
    os.kill(processes._process.pid, 9)
    processes._process.wait(10)
    opened = environments.open_episode("guess", ROW)
    assert environments.step_episode(opened.episode_id, "42").done
    assert processes.restarts == before + 1
    assert "zerobubble_environment_process_restarts_total" in metrics(environment_host)


def test_an_environment_that_does_not_import_stops_the_start_naming_its_entry(tmp_path):
    (tmp_path / "broken_env.py").write_text("raise RuntimeError('cannot start')\n")
    entries = [{"name": "calculator", "builtin": "calculator"},
               {"name": "broken", "environment": "broken_env:Nothing", "path": str(tmp_path)}]
    config = load_config(EnvironmentServiceConfig, overrides={"server.listen": "127.0.0.1:0", "environments": entries})
    with pytest.raises(ConfigError, match=r"environments\[1\].*cannot start"):
        build(config)


@pytest.mark.parametrize(("entry", "says"), [
    ({"name": "x"}, "exactly one of environment"),
    ({"name": "x", "builtin": "calculator", "environment": "a:B"}, "exactly one of environment"),
    ({"name": "x", "environment": "not a target"}, "module:Class"),
    ({"name": "x", "builtin": "tools"}, "at least one tool"),
    ({"name": "x", "builtin": "calculator", "final_answer": "nearly"}, "module:function"),
    ({"name": "x", "builtin": "python", "final_answer": "my:rule"}, "the python builtin takes one of"),
])
def test_bad_environment_entries_are_refused_naming_the_field(entry, says):
    with pytest.raises(ConfigError, match=says):
        load_config(EnvironmentServiceConfig, overrides={"environments": [entry]})


def test_zerobubble_serve_environment_prints_its_address_first_and_stops_on_sigterm(tmp_path):
    import signal
    import subprocess
    import sys

    import yaml
    from env_helpers import ENVIRONMENTS

    config = tmp_path / "environment.yaml"
    config.write_text(yaml.safe_dump({"server": {"listen": "127.0.0.1:0", "grace_seconds": 1.0},
                                      "environments": [entry for entry in ENVIRONMENTS if entry["name"] == "guess"]}))
    serve = subprocess.Popen([sys.executable, "-m", "zerobubble", "serve", "environment", "--config", str(config)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = json.loads(serve.stdout.readline())
        assert ready["service"] == "environment"
        with client_of(type("Host", (), {"address": ready["address"]})) as client:
            opened = client.open_episode("guess", ROW)
            assert not client.step_episode(opened.episode_id, "1").done
            assert client.step_episode(opened.episode_id, "42").done
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
        assert "sample_envs imported" in serve.stderr.read()
    finally:
        serve.kill()
        serve.wait()
