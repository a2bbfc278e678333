"""The python tool keeps to limits.step_timeout_s for the whole step, all its calls together, and to the client's own
deadline: its programs are killed at the deadline, and a program of another episode waits for a sandbox slot no
longer than its own step may take. Before, a step of eight `time.sleep(60)` took 40 s against a 10 s limit."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from env_helpers import TEST_SETTINGS

from zerobubble.common.clients.environment import EnvironmentClient
from zerobubble.common.config import ClientConfig

STEP_TIMEOUT = TEST_SETTINGS["limits.step_timeout_s"]  # 2 s; the sandbox's own wall limit is 5 s a program
SLEEPS = " ".join(["@python(import time\ntime.sleep(60))"] * 8)


def sandbox_processes(host) -> list[str]:
    return [pid for slot in host.sandbox.cgroups.slots for pid in Path(slot, "cgroup.procs").read_text().split()]


def timed_step(client, episode_id: str, text: str):
    started = time.monotonic()
    step = client.step_episode(episode_id, text)
    return step, time.monotonic() - started


def test_a_step_of_eight_sleeping_programs_ends_at_the_step_timeout_and_kills_them(environment_host, environments):
    sleeper = environments.open_episode("python", {}).episode_id
    other = environments.open_episode("python", {}).episode_id
    with ThreadPoolExecutor(2) as pool:
        sleeping = pool.submit(timed_step, environments, sleeper, SLEEPS)
        time.sleep(0.5)  # the sleeper holds the only sandbox slot (sandbox.slots: 1)
        printing = pool.submit(timed_step, environments, other, "@python(print(1))")
        (step, seconds), (other_step, other_seconds) = sleeping.result(), printing.result()
    assert (step.done, step.ended_reason) == (True, "timeout")
    assert seconds < STEP_TIMEOUT + 2  # not 8 programs of 5 s each
    assert sandbox_processes(environment_host) == []  # the program running at the deadline was killed
    # The other episode waited for the slot within its own step's time: it ran after, or ended with timeout.
    assert other_seconds < STEP_TIMEOUT + 2
    assert other_step.ended_reason == "timeout" or '"1\\n"' in other_step.observation_json
    # The service goes on: a fresh episode's program runs.
    fresh = environments.open_episode("python", {}).episode_id
    assert '"1\\n"' in environments.step_episode(fresh, "@python(print(1))").observation_json


def test_a_python_step_ends_before_the_clients_own_deadline(environment_host):
    with EnvironmentClient(ClientConfig(address=environment_host.address, timeout_seconds=1.0)) as client:
        episode = client.open_episode("python", {}).episode_id
        step, seconds = timed_step(client, episode, "@python(import time\ntime.sleep(60))")
    assert (step.done, step.ended_reason) == (True, "timeout")  # an answer, not DEADLINE_EXCEEDED
    assert seconds < 1.0
    assert sandbox_processes(environment_host) == []
