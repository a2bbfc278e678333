"""Environments as a user writes them (docs/guides/environments.md), from a folder outside the package: one that
behaves, and one for each way an environment can fail."""

import os
import time

# What an environment's module prints goes to the service's log, not into the line `zerobubble serve` prints.
print("sample_envs imported")


class GuessNumber:
    """The model guesses the row's ground truth; the environment says higher or lower."""

    def reset(self, row):
        self.target = int(row["ground_truth"])
        self.guesses = 0
        return " Guess my number between 1 and 100."

    def step(self, assistant_text):
        self.guesses += 1
        guess = int(assistant_text.strip().split()[-1])
        if guess == self.target:
            return {"observation": None, "reward": 1.0, "done": True, "info": {"guesses": self.guesses}}
        hint = "higher" if guess < self.target else "lower"
        return {"observation": [{"role": "user", "content": hint}], "reward": 0.0, "done": False, "info": {}}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: what to shout
    """
    return text.upper()


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError("the tool broke")


class AddTools:
    """Tools only: the generic tool environment drives it; the final answer is scored by final_reward."""

    tools = [add, shout, broken]

    def reset(self, row):
        return [{"role": "system", "content": "Use the tools."}]

    def final_reward(self, answer_text, row):
        return 1.0 if answer_text.strip() == str(row["ground_truth"]) else 0.0


class Hangs:
    def reset(self, row):
        if row.get("hang_in_reset"):
            time.sleep(3600)
        return None

    def step(self, assistant_text):
        if assistant_text == "hang":
            time.sleep(3600)
        with open("/proc/self/stat") as stat:  # its start, in ticks since boot: the same seen from any namespace
            started = int(stat.read().rpartition(")")[2].split()[19])
        return {"observation": "ok", "reward": 0.5, "done": False,
                "info": {"pid": os.getpid(), "started": started, "environment": sorted(os.environ)}}


class Raises:
    def reset(self, row):
        return None

    def step(self, assistant_text):
        raise ValueError("the environment broke")


class Exits:
    def reset(self, row):
        return None

    def step(self, assistant_text):
        os._exit(3)


class Garbage:
    def reset(self, row):
        return None

    def step(self, assistant_text):
        if assistant_text == "object":
            return {"observation": object(), "reward": 0.0, "done": False, "info": {}}
        if assistant_text == "nan":
            return {"observation": None, "reward": float("nan"), "done": False, "info": {}}
        return "not a dict"


class Huge:
    def reset(self, row):
        return None

    def step(self, assistant_text):
        # 16x limits.max_observation_bytes: a larger one only slows a loaded machine past the step's timeout
        return {"observation": "x" * (1024 * 1024), "reward": 0.0, "done": False, "info": {}}


class NeverDone:
    def reset(self, row):
        return "go"

    def step(self, assistant_text):
        return {"observation": "again", "reward": 0.1, "done": False, "info": {}}


class ResetFails:
    def reset(self, row):
        raise KeyError("no such column")

    def step(self, assistant_text):
        return {"observation": None, "reward": 0.0, "done": True, "info": {}}


class Forger:
    """Writes its own frames on the episode's socket, past the checks of the episode's process: the service must
    bound and check what it reads itself."""

    def reset(self, row):
        return None

    def step(self, assistant_text):
        import struct

        frames = {"not_json": b"\xff\xfe not json", "huge": b"", "wrong_shape": b'["stepped", 1]',
                  "bad_code": b'["failed", "anything I like", "x"]',
                  # Past the decoder's recursion guard, past the service's depth bound, past int()'s digit limit.
                  "deep": b'["stepped", ' + b"[" * 50_000 + b"]" * 50_000 + b', 0.0, false, {}, 0]',
                  "nested": b'["stepped", null, 0.0, false, ' + b'{"a": ' * 500 + b"{}" + b"}" * 500 + b', 0]',
                  "digits": b'["stepped", null, 1' + b"0" * 5000 + b', false, {}, 0]'}
        payload = frames[assistant_text]
        header = struct.pack("!i", 2 ** 31 - 1 if assistant_text == "huge" else len(payload))
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    os.write(int(fd), header + payload)
            except OSError:
                continue
        time.sleep(3600)


class Detaches:
    """Starts a program in a session of its own, as a user's environment may (a server, a shell), named by the
    row's `marker` so that a test finds it among the host's processes; then goes on, or hangs."""

    def reset(self, row):
        self.marker = row["marker"]
        return None

    def step(self, assistant_text):
        import subprocess

        subprocess.Popen(["sleep", self.marker], start_new_session=True, stdout=subprocess.DEVNULL)
        if assistant_text == "hang":
            time.sleep(3600)
        return {"observation": "started", "reward": 0.0, "done": False, "info": {}}


class ForkBomb:
    """Forks until a fork fails (or a thousand times): how many processes its episode could make."""

    def reset(self, row):
        return None

    def step(self, assistant_text):
        made, why = 0, "no limit within 1000"
        while made < 1000:
            try:
                pid = os.fork()
            except OSError as exc:
                why = type(exc).__name__
                break
            if pid == 0:
                time.sleep(3600)
                os._exit(0)
            made += 1
        return {"observation": f"{made} {why}", "reward": 0.0, "done": False, "info": {}}


class Snoops:
    """Looks for the service (the row's `service_pid`) from inside its episode: its user, and what /proc shows."""

    def reset(self, row):
        self.service = row["service_pid"]
        return None

    def step(self, assistant_text):
        try:
            with open(f"/proc/{self.service}/environ", "rb") as file:
                environ = f"read {len(file.read())} bytes"
        except OSError as exc:
            environ = type(exc).__name__
        visible = [name for name in os.listdir("/proc") if name.isdigit()]
        return {"observation": None, "reward": 0.0, "done": False,
                "info": {"uid": os.getuid(), "environ": environ, "processes": len(visible)}}
