"""The code sandbox, in-process: verdicts, limits, and hostile programs that must score 0 and leave nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from sandbox_leaks import (
    ESCAPED,
    connect_program,
    host_only_mounts,
    host_secret_file,
    host_sockets,
    memory_program,
    mounts_program,
    read_file_program,
    sysv_keys,
    sysv_keys_on_host,
    sysv_leave_program,
    sysv_read_program,
)

import zerobubble.reward
from zerobubble.common.sandbox.config import SandboxConfig
from zerobubble.common.sandbox.runner import CodeSandbox, Isolation, SandboxUnavailable

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs programs under their own "
                                "uids, which needs root")

# Slot uids differ between concurrent test runs (xdist workers, two checkouts), whose leftover checks
# would otherwise see each other's programs.
LIMITS = {"slots": 2, "uid_base": 62000 + 2 * (os.getpid() % 1000), "wall_seconds": 3.0, "cpu_seconds": 2,
          "memory_bytes": 256 * 1024 * 1024, "max_processes": 16, "max_file_bytes": 1024 * 1024,
          "max_output_bytes": 64 * 1024}
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture
def make_sandbox():
    made = []

    def make(**changes) -> CodeSandbox:
        made.append(CodeSandbox(SandboxConfig(**(LIMITS | changes))))
        return made[-1]

    yield make
    for sandbox in made:
        sandbox.close()


# Every check runs against both ways of starting a run: in the slot's warm sandbox (the default) and in a
# bubblewrap sandbox of its own.
@pytest.fixture(params=[True, False], ids=["warm", "cold"])
def sandbox(make_sandbox, request) -> CodeSandbox:
    sandbox = make_sandbox(warm_slots=request.param)
    if not sandbox.isolation.full:
        pytest.skip(f"no full isolation on this machine: {sandbox.isolation.reason}")
    return sandbox


@pytest.fixture
def open_dir():
    """A root-owned, world-writable directory that every user can reach (unlike pytest's tmp_path)."""
    path = Path(tempfile.mkdtemp(prefix="zb-sandbox-test-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def slot_processes(sandbox: CodeSandbox, *, zombies: bool = True) -> list[str]:
    """Processes in which any uid (real, effective, saved, filesystem) is one of the sandbox's slot uids."""
    uids = {str(sandbox.config.uid_base + slot) for slot in range(sandbox.config.slots)}
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        except OSError:
            continue  # it exited meanwhile
        if uids & set(fields["Uid"].split()) and (zombies or not fields["State"].strip().startswith("Z")):
            found.append(status.parent.name)
    return found


def assert_still_works(sandbox: CodeSandbox) -> None:
    report = sandbox.run_tests(ADD, ["2 3"], ["5"], stop_at_first_failure=True)
    assert (report.passed, report.status) == (1, "ok")


def test_the_isolation_is_full_here(make_sandbox):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (make sandbox-tool)")
    assert make_sandbox().isolation == Isolation()


def test_correct_program_passes(sandbox):
    report = sandbox.run_tests(ADD, ["1 2", "10 -4"], ["3", "6"], stop_at_first_failure=False)
    assert (report.passed, report.total, report.status) == (2, 2, "ok")


def test_wrong_output_fails(sandbox):
    report = sandbox.run_tests("print(4)", ["1 2", "2 2"], ["3", "4"], stop_at_first_failure=False)
    assert (report.passed, report.total, report.status) == (1, 2, "wrong_answer")


def test_stop_at_first_failure_stops(sandbox):
    inputs, outputs = ["1 1", "1 2", "2 2"], ["0", "3", "4"]
    stopped = sandbox.run_tests(ADD, inputs, outputs, stop_at_first_failure=True)
    assert (stopped.passed, stopped.total, stopped.status) == (0, 3, "wrong_answer")
    full = sandbox.run_tests(ADD, inputs, outputs, stop_at_first_failure=False)
    assert (full.passed, full.total) == (2, 3)


def test_trailing_whitespace_is_ignored_but_not_inner(sandbox):
    source = 'print("1 2   ")\nprint("x\\t")\nprint()\nprint("  ")\n'
    assert sandbox.run_tests(source, [""], ["1 2\nx"], stop_at_first_failure=True).passed == 1
    assert sandbox.run_tests(source, [""], ["1  2\nx"], stop_at_first_failure=True).passed == 0


def test_runtime_error(sandbox):
    result = sandbox.run("raise ValueError('boom')", "")
    assert (result.status, result.exit_code) == ("runtime_error", 1)
    assert "ValueError: boom" in result.stderr
    assert sandbox.run_tests("raise SystemExit(3)", [""], [""], stop_at_first_failure=True).status == \
        "runtime_error"


def test_the_program_sees_what_a_script_run_by_the_interpreter_sees(sandbox):
    # It runs in the launcher's interpreter rather than a new one: as __main__ with the script's file and argv,
    # site's builtins, tracebacks and syntax errors from main.py on, and no descriptor but its standard three.
    source = """
import os, sys
print(__name__, __file__, sys.argv, sys.modules["__main__"].__file__, callable(exit))
print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
def fail():
    raise KeyError("deep")
fail()
"""
    result = sandbox.run(source, "")
    assert (result.status, result.exit_code) == ("runtime_error", 1)
    names, descriptors = result.stdout.splitlines()
    assert names == "__main__ /tmp/main.py ['main.py'] /tmp/main.py True"
    assert descriptors == "[0, 1, 2, 3]"  # 3: the listing's own
    assert result.stderr.startswith('Traceback (most recent call last):\n  File "/tmp/main.py", line 7')
    assert result.stderr.rstrip().endswith("KeyError: 'deep'") and "sandbox_entry" not in result.stderr
    broken = sandbox.run("def f(:\n    pass\n", "")
    assert (broken.status, broken.exit_code) == ("runtime_error", 1)
    assert broken.stderr.startswith('  File "/tmp/main.py", line 1') and "SyntaxError" in broken.stderr
    assert sandbox.run("exit(5)", "").exit_code == 5


def test_the_program_sees_its_own_cgroups_as_the_root(sandbox):
    result = sandbox.run('print(open("/proc/self/cgroup").read(), end="")', "")
    assert result.status == "ok" and result.stdout
    assert [line.rpartition(":")[2] for line in result.stdout.splitlines()] == ["/"] * len(result.stdout.splitlines())


def test_a_program_ends_as_at_the_interpreters_exit(sandbox):
    # A warm slot's program skips the interpreter's teardown: what a program can see of its exit must not change.
    source = """
import atexit, sys, threading, time
atexit.register(lambda: print("exit handler"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread"))).start()
sys.stdout.write("unflushed")
"""
    result = sandbox.run(source, "")
    assert (result.status, result.stdout) == ("ok", "unflushedthread\nexit handler\n")
    said = sandbox.run('import sys\nsys.exit("bye")', "")
    assert (said.status, said.exit_code, said.stderr) == ("runtime_error", 1, "bye\n")


def test_large_stdin_is_fed_whole(sandbox):
    data = "".join(f"{i}\n" for i in range(160_000))
    assert len(data) > 1_000_000
    source = "import sys, hashlib\nd = sys.stdin.buffer.read()\nprint(len(d), hashlib.sha256(d).hexdigest())"
    result = sandbox.run(source, data)
    assert result.status == "ok"
    assert result.stdout.split() == [str(len(data)), hashlib.sha256(data.encode()).hexdigest()]


def test_program_runs_as_a_slot_user_in_a_clean_environment(sandbox):
    source = "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\nprint(*sorted(os.environ))"
    ids, environment = sandbox.run(source, "").stdout.splitlines()
    uid, gid, groups = ids.split(maxsplit=2)
    assert int(uid) in range(sandbox.config.uid_base, sandbox.config.uid_base + 2)
    assert gid == uid and groups == "[]"
    # PWD is bubblewrap's, and names the private /tmp.
    assert set(environment.split()) <= {"PATH", "LANG", "HOME", "PYTHONDONTWRITEBYTECODE", "LC_CTYPE", "PWD"}


def test_tmp_is_writable_and_bounded(sandbox):
    source = """
import os
with open("data.txt", "w") as f:
    f.write("kept")
print(open("data.txt").read())
written = 0
try:
    for i in range(10):
        with open(f"big{i}", "wb") as f:
            f.write(bytes(512 * 1024))
        written += 1
except OSError as exc:
    print("stopped after", written, exc.errno)
"""
    result = sandbox.run(source, "")
    lines = result.stdout.splitlines()
    assert lines[0] == "kept"
    assert lines[1].startswith("stopped after") and int(lines[1].split()[2]) <= 2  # a 1 MiB tmpfs
    assert "kept" not in sandbox.run('print(open("data.txt").read())', "").stdout


# It counts every process of the sandbox's uids on this machine, so it runs where no other test uses the sandbox
# at the same time: in make test, not in the parallel make test-fast.
@pytest.mark.slow
def test_bounded_fork_bomb_is_contained(sandbox):
    source = """
import os, time
spawned = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    spawned += 1
print("spawned", spawned)
"""
    started = time.monotonic()
    report = sandbox.run_tests(source, [""], ["spawned 200"], stop_at_first_failure=True)
    assert report.passed == 0
    assert time.monotonic() - started < sandbox.config.wall_seconds + 2
    assert slot_processes(sandbox) == []
    assert_still_works(sandbox)


def test_endless_loops_hit_the_time_limits(sandbox):
    kills = sandbox.kills
    started = time.monotonic()
    sleeper = sandbox.run("import time\ntime.sleep(100)", "")  # no CPU used: the wall clock stops it
    assert sleeper.status == "time_limit"
    assert sandbox.config.wall_seconds <= time.monotonic() - started < sandbox.config.wall_seconds + 1.5
    assert sandbox.kills == kills + 1
    spinner = sandbox.run_tests("while True:\n    pass", [""], [""], stop_at_first_failure=True)
    assert (spinner.passed, spinner.status) == (0, "time_limit")
    assert_still_works(sandbox)


def test_memory_hog_is_stopped(sandbox):
    source = "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"
    result = sandbox.run(source, "")
    assert result.status == "memory_limit"
    assert sandbox.run_tests(source, [""], [""], stop_at_first_failure=True).passed == 0
    assert_still_works(sandbox)


def test_nothing_can_be_written_outside_the_workdir(sandbox, open_dir):
    token = uuid.uuid4().hex
    targets = [open_dir / token, Path("/tmp") / token, Path("/dev/shm") / token]
    source = f"""
written = 0
for path in {[str(p) for p in targets]!r}:
    try:
        with open(path, "w") as f:
            f.write("escaped")
        written += 1
    except OSError:
        pass
print(written)
"""
    try:
        report = sandbox.run_tests(source, [""], [str(len(targets))], stop_at_first_failure=True)
        assert report.passed == 0
        assert [p for p in targets if p.exists()] == []
    finally:
        for path in targets:
            path.unlink(missing_ok=True)


def test_no_network_not_even_loopback(sandbox):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        source = f"""
import socket
import subprocess
import sys
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    print("connected")
except OSError:
    pass
"""
        report = sandbox.run_tests(source, [""], ["connected"], stop_at_first_failure=True)
        assert report.passed == 0
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_the_service_environment_does_not_leak(sandbox, monkeypatch):
    secret = f"zb-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("ZB_SECRET_TEST", secret)
    source = """
import glob, os
found = {v for v in os.environ.values() if v.startswith("zb-secret-")}
for path in [f"/proc/{os.getppid()}/environ", "/proc/1/environ", *glob.glob("/proc/*/environ")]:
    try:
        data = open(path, "rb").read().decode(errors="replace")
    except OSError:
        continue
    found |= {item.partition("=")[2] for item in data.split("\\0") if "=zb-secret-" in item}
print("\\n".join(sorted(found)))
"""
    assert sandbox.run_tests(source, [""], [secret], stop_at_first_failure=True).passed == 0
    assert secret not in sandbox.run(source, "").stdout


def test_files_only_root_may_read_stay_unread(sandbox, open_dir):
    open_dir.chmod(0o755)
    secret = f"zb-secret-{uuid.uuid4().hex}"
    path = open_dir / "secret.txt"
    path.write_text(secret)
    path.chmod(0o600)
    report = sandbox.run_tests(f"print(open({str(path)!r}).read())", [""], [secret], stop_at_first_failure=True)
    assert report.passed == 0


# It counts every process of the sandbox's uids on this machine, so it runs where no other test uses the sandbox
# at the same time: in make test, not in the parallel make test-fast.
@pytest.mark.slow
def test_killing_the_parent_changes_nothing(sandbox):
    source = """
import os
done = []
for name, kill in [("parent", lambda: os.kill(os.getppid(), 9)), ("everyone", lambda: os.kill(-1, 9)),
                   ("group", lambda: os.killpg(os.getpgid(os.getppid()), 9))]:
    try:
        kill()
        done.append(name)
    except OSError:
        pass
print(*done)
"""
    report = sandbox.run_tests(source, [""], ["parent everyone group"], stop_at_first_failure=True)
    assert report.passed == 0
    assert slot_processes(sandbox) == []
    assert_still_works(sandbox)


def test_a_gigabyte_of_output_is_cut_short(sandbox):
    source = 'import sys\nchunk = "x" * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)'
    kills = sandbox.kills
    result = sandbox.run(source, "")
    assert result.status == "output_limit"
    assert result.seconds < 2
    assert len(result.stdout) <= sandbox.config.max_output_bytes
    assert sandbox.kills == kills + 1
    assert_still_works(sandbox)


def test_concurrent_runs_all_succeed(sandbox):
    results = {}

    def run(i: int) -> None:
        results[i] = sandbox.run("import time\ntime.sleep(0.3)\nprint(int(input()) * 2)", str(i))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {i: (r.status, r.stdout) for i, r in results.items()} == {i: ("ok", f"{2 * i}\n") for i in range(4)}


REFUSED = """
import zerobubble.reward
from zerobubble.common.sandbox.config import SandboxConfig
from zerobubble.common.sandbox.runner import CodeSandbox, SandboxUnavailable
sandbox = CodeSandbox(SandboxConfig(slots=1))
print(sandbox.isolation.reason)
try:
    sandbox.run("print(1)", "")
except SandboxUnavailable:
    print("refused")
"""


def test_without_root_nothing_runs():
    # In a fresh user namespace without a uid mapping the service is not root.
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("util-linux unshare is not installed")
    result = subprocess.run([unshare, "--user", sys.executable, "-c", REFUSED],
                            capture_output=True, text=True, timeout=60)
    reason, refused = result.stdout.splitlines()
    assert "not running as root" in reason
    assert refused == "refused"


def test_world_readable_host_files_stay_unread(sandbox):
    with host_secret_file() as (path, secret):
        result = sandbox.run(read_file_program(path), "")
    assert secret not in result.stdout
    assert (result.status, result.stdout) == ("ok", "")


def test_host_unix_sockets_are_out_of_reach(sandbox):
    with host_sockets() as (path, abstract, listeners):
        result = sandbox.run(connect_program(path, abstract), "")
        for listener in listeners:
            with pytest.raises(BlockingIOError):
                listener.accept()
    assert (result.status, result.stdout) == ("ok", "")


def test_system_v_ipc_is_private_to_a_run_and_gone_after_it(sandbox):
    message = f"zb-message-{uuid.uuid4().hex}"
    with sysv_keys() as (shm_key, msg_key):
        left = sandbox.run(sysv_leave_program(shm_key, msg_key, 64 * 1024 * 1024, message), "")
        assert left.status == "ok", left
        assert shm_key not in sysv_keys_on_host("-M")
        assert msg_key not in sysv_keys_on_host("-Q")
        # Runs take the free slots in turn, so this one runs under the other slot's uid.
        later = sandbox.run(sysv_read_program(msg_key), "")
    assert (later.status, later.stdout) == ("ok", "")


def test_host_mounts_are_not_listed(sandbox):
    host_only = host_only_mounts()
    assert "/sys" in host_only
    result = sandbox.run(mounts_program(host_only), "")
    assert (result.status, result.stdout) == ("ok", "")


def test_no_process_of_the_run_shows_a_host_path(sandbox):
    source = """
import glob
for path in glob.glob("/proc/[0-9]*/cmdline"):
    print(open(path).read().replace("\\0", " "))
"""
    result = sandbox.run(source, "")
    assert result.status == "ok" and "sandbox_entry.py" in result.stdout  # it could read them
    assert str(Path(zerobubble.reward.__file__).parent) not in result.stdout


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_memory_is_bounded_for_the_whole_run_not_per_process(make_sandbox, warm):
    # Four processes, each under the per-process limit, together well past the run's bound. Filling them takes
    # seconds on a loaded machine: a wall limit that cannot come first.
    sandbox = make_sandbox(warm_slots=warm, wall_seconds=30.0, cpu_seconds=20)
    if not sandbox.isolation.full:
        pytest.skip(f"no full isolation on this machine: {sandbox.isolation.reason}")
    share = sandbox.config.memory_bytes * 6 // 10
    result = sandbox.run(memory_program(4, share), "")
    assert ESCAPED not in result.stdout
    assert result.status == "memory_limit", result
    assert_still_works(sandbox)


def test_without_bubblewrap_nothing_runs(make_sandbox):
    sandbox = make_sandbox(bwrap="/nonexistent/bwrap")
    assert not sandbox.isolation.full
    assert "bubblewrap" in sandbox.isolation.reason
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        sandbox.run("print(1)", "")


def test_each_sandbox_has_its_own_cgroups_and_removes_them(make_sandbox):
    first, second = make_sandbox(), make_sandbox()
    assert first.cgroups.base != second.cgroups.base
    assert [slot.exists() for slot in first.cgroups.slots] == [True, True]
    first.close()
    assert not first.cgroups.base.exists()
    assert_still_works(second)


def test_cgroups_left_by_a_dead_service_are_removed(make_sandbox):
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    stale = make_sandbox().cgroups.base.parent / f"zerobubble-sandbox-{gone.pid}-0"
    (stale / "slot-0").mkdir(parents=True)
    make_sandbox()
    assert not stale.exists()


def test_closing_kills_the_runs_in_progress_and_refuses_new_ones(make_sandbox):
    sandbox = make_sandbox(wall_seconds=60.0, cpu_seconds=60)
    results = []
    run = threading.Thread(target=lambda: results.append(sandbox.run("import time\ntime.sleep(60)", "")))
    run.start()
    started = time.monotonic()
    while not any((slot / "cgroup.procs").read_text().split() for slot in sandbox.cgroups.slots):
        assert time.monotonic() - started < 30, "the run never started"
        time.sleep(0.05)
    sandbox.close()
    run.join(timeout=30)
    assert not run.is_alive()
    assert results[0].status != "ok"
    assert not sandbox.cgroups.base.exists()
    with pytest.raises(SandboxUnavailable, match="closed"):
        sandbox.run("print(1)", "")


FORGOTTEN = """
from zerobubble.common.sandbox.config import SandboxConfig
from zerobubble.common.sandbox.runner import CodeSandbox
sandbox = CodeSandbox(SandboxConfig(slots=1))
print(sandbox.cgroups.base, flush=True)
"""


def test_a_sandbox_nobody_closed_removes_its_cgroups_at_exit(sandbox):
    result = subprocess.run([sys.executable, "-c", FORGOTTEN], capture_output=True, text=True, timeout=60)
    base = Path(result.stdout.strip())
    assert base.name.startswith("zerobubble-sandbox-"), result.stderr
    assert not base.exists()


def test_the_next_run_of_a_slot_gets_its_whole_memory_bound(make_sandbox):
    # The kernel frees an IPC namespace's shared memory a moment after its last process exits: until then
    # it still counts against the slot's bound.
    sandbox = make_sandbox(slots=1)
    share = sandbox.config.memory_bytes * 6 // 10
    with sysv_keys() as (shm_key, msg_key):
        assert sandbox.run(sysv_leave_program(shm_key, msg_key, share, "left"), "").status == "ok"
    stat = dict(line.split() for line in (sandbox.cgroups.slots[0] / "memory.stat").read_text().splitlines())
    assert int(stat["shmem"]) == 0


# The kernel's keyrings are not namespaced: a key in the uid's own keyring (KEY_SPEC_USER_KEYRING) outlives the run.
KEYRING = """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, REQUEST_KEY, KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[platform.machine()]
USER_KEYRING, KEYCTL_READ = ctypes.c_long(-4), 11
"""
LEAVE_BEHIND = KEYRING + """
import os, time
with open("/tmp/left.txt", "w") as f:
    f.write("left")
os.mkdir("/tmp/folder")
libc.syscall(ADD_KEY, b"user", b"zb-left", b"left", 4, USER_KEYRING)
if os.fork() == 0:  # a process that would outlive the run, in a session of its own
    os.setsid()
    time.sleep(60)
    os._exit(0)
print("left")
"""
LOOK_AROUND = KEYRING + """
import os
key = libc.syscall(REQUEST_KEY, b"user", b"zb-left", None, 0)
found = ctypes.create_string_buffer(16)
if key > 0 and libc.syscall(KEYCTL, KEYCTL_READ, ctypes.c_long(key), found, 16) > 0:
    print(found.value.decode())
print(sorted(os.listdir("/tmp")))
mine = os.getuid()
others = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        uids = [line.split()[1] for line in open(f"/proc/{pid}/status") if line.startswith("Uid:")]
    except OSError:
        continue
    if int(pid) != os.getpid() and uids == [str(mine)]:
        others.append(pid)
print(others)
"""


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_nothing_a_run_leaves_reaches_the_next_run_of_its_slot(make_sandbox, warm):
    # One slot, so that both runs have the same uid and, when warm, the same slot's sandbox.
    sandbox = make_sandbox(slots=1, warm_slots=warm)
    message = f"zb-message-{uuid.uuid4().hex}"
    with sysv_keys() as (shm_key, msg_key):
        assert sandbox.run(LEAVE_BEHIND, "").stdout == "left\n"
        assert sandbox.run(sysv_leave_program(shm_key, msg_key, 1024 * 1024, message), "").status == "ok"
        later = sandbox.run(sysv_read_program(msg_key), "")
        looked = sandbox.run(LOOK_AROUND, "")
    assert (later.status, later.stdout) == ("ok", "")
    assert (looked.status, looked.stdout) == ("ok", "['main.py']\n[]\n")
    assert slot_processes(sandbox, zombies=False) == []
