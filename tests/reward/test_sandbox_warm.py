"""A slot's warm sandbox: programs hold no capability, and a slot's sandbox that died, or whose run went wrong,
is replaced; one whose service died goes too; where warm slots cannot start, each program gets a sandbox of its
own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_sandbox import LIMITS, assert_still_works

from zerobubble.common.sandbox import runner
from zerobubble.common.sandbox.config import SandboxConfig
from zerobubble.common.sandbox.runner import CodeSandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs programs under their own "
                                "uids, which needs root")


@pytest.fixture
def sandbox():
    sandbox = CodeSandbox(SandboxConfig(**(LIMITS | {"slots": 1, "warm_slots": True})))
    if not sandbox.isolation.full:
        sandbox.close()
        pytest.skip(f"no full isolation on this machine: {sandbox.isolation.reason}")
    yield sandbox
    sandbox.close()


def zygote_pids(sandbox: CodeSandbox) -> list[int]:
    """The processes of slot 0's warm sandbox (its launcher, bubblewrap, its init and the zygote)."""
    return [int(pid) for pid in sandbox.cgroups.zygote_procs(0).read_text().split()]


def test_programs_hold_no_capability_not_even_in_their_bounding_set(sandbox):
    source = 'print(*(line.split()[1] for line in open("/proc/self/status") if line.startswith("Cap")))'
    result = sandbox.run(source, "")
    assert result.status == "ok", result
    # Inheritable, permitted, effective, bounding, ambient.
    assert result.stdout.split() == ["0000000000000000"] * 5


def test_the_slot_keeps_its_sandbox_between_good_runs(sandbox):
    before = zygote_pids(sandbox)
    assert before
    assert_still_works(sandbox)
    assert sandbox.run("raise ValueError", "").status == "runtime_error"
    assert zygote_pids(sandbox) == before


@pytest.mark.parametrize("source", ["import time\ntime.sleep(100)", "print('x' * (1 << 20), end='')"],
                         ids=["time_limit", "output_limit"])
def test_a_killed_run_replaces_the_slot_sandbox(sandbox, source):
    before = zygote_pids(sandbox)
    assert sandbox.run(source, "").status in {"time_limit", "output_limit"}
    assert set(zygote_pids(sandbox)).isdisjoint(before)
    assert_still_works(sandbox)


def test_a_dead_zygote_is_replaced_at_the_next_run(sandbox):
    before = zygote_pids(sandbox)
    assert before
    for pid in before:
        # Killing one (bubblewrap, say) can take the later ones down before their turn.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert_still_works(sandbox)
    assert set(zygote_pids(sandbox)).isdisjoint(before)


ABANDONED = """
import os
from zerobubble.common.sandbox import runner
from zerobubble.common.sandbox.config import SandboxConfig
from zerobubble.common.sandbox.runner import CodeSandbox
sandbox = CodeSandbox(SandboxConfig(slots=1, uid_base={uid_base}))
assert sandbox.run("print(1)", "").stdout == "1\\n"
print(sandbox.cgroups.zygote_procs(0), flush=True)
os.kill(os.getpid(), 9)
"""


def test_the_slot_sandbox_ends_with_its_service():
    # Killed, the service closes nothing: its end of the zygote's socket goes with it, and the zygote with that.
    result = subprocess.run([sys.executable, "-c", ABANDONED.format(uid_base=LIMITS["uid_base"])],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGKILL, result.stderr
    procs = Path(result.stdout.strip())
    deadline = time.monotonic() + 10
    while procs.read_text().split() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.read_text().split() == []


def test_where_warm_slots_cannot_start_each_program_gets_a_sandbox_of_its_own(monkeypatch):
    monkeypatch.setattr(runner, "_ZYGOTE_ISOLATION", ("--no-such-option",))  # bubblewrap refuses to start
    sandbox = CodeSandbox(SandboxConfig(**(LIMITS | {"slots": 1, "warm_slots": True})))
    try:
        assert sandbox.isolation.full, sandbox.isolation.reason
        assert not sandbox.warm
        assert_still_works(sandbox)
        assert sandbox.cgroups.zygote_procs(0).read_text().split() == []
    finally:
        sandbox.close()
