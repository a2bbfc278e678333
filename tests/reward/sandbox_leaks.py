"""Programs that reach for the host around the code sandbox, and the host objects they reach for.

Shared by the in-process tests (test_sandbox.py) and those through the running service
(test_sandbox_service.py). Each program prints ESCAPED only when it got through, so a test case that
expects ESCAPED passes, and scores above 0, only for an escape.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

ESCAPED = "escaped"
# Mounts a sandboxed program may see: its own root, interpreter, /proc, /dev and /tmp.
SANDBOX_MOUNTS = ("/", "/usr", "/proc", "/dev", "/tmp")


@contextlib.contextmanager
def host_secret_file() -> Iterator[tuple[Path, str]]:
    """A file any user may read (0644, in a 0755 folder) outside /tmp, holding a fresh secret."""
    folder = Path(tempfile.mkdtemp(prefix="zb-host-", dir="/var/tmp"))
    try:
        folder.chmod(0o755)
        secret = f"zb-secret-{uuid.uuid4().hex}"
        path = folder / "answers.jsonl"
        path.write_text(secret)
        path.chmod(0o644)
        yield path, secret
    finally:
        shutil.rmtree(folder)


def read_file_program(path: Path) -> str:
    return f"try:\n    print(open({str(path)!r}).read())\nexcept OSError:\n    pass"


@contextlib.contextmanager
def host_sockets() -> Iterator[tuple[str, str, list[socket.socket]]]:
    """A world-writable UNIX socket on the filesystem (outside /tmp) and an abstract one, listening.
    Yields both addresses and the listeners, which are non-blocking: accept() raises BlockingIOError
    while nobody has connected."""
    folder = Path(tempfile.mkdtemp(prefix="zb-host-", dir="/var/tmp"))
    path = str(folder / "service.sock")
    abstract = f"\0zb-host-{uuid.uuid4().hex}"
    listeners = []
    try:
        folder.chmod(0o755)
        for address in (path, abstract):
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(address)
            listener.listen()
            listener.setblocking(False)
            listeners.append(listener)
        os.chmod(path, 0o777)
        yield path, abstract, listeners
    finally:
        for listener in listeners:
            listener.close()
        shutil.rmtree(folder)


def connect_program(path: str, abstract: str) -> str:
    return f"""
import socket
for address in ({path!r}, {abstract!r}):
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1)
            s.connect(address)
            s.sendall(b"hello")
        print({ESCAPED!r})
        break
    except OSError:
        pass
"""


def host_only_mounts() -> set[str]:
    """The host's mount points that a sandboxed program has no business seeing."""
    points = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    return {p for p in points if p not in SANDBOX_MOUNTS and not p.startswith(("/proc/", "/dev/"))}


def mounts_program(host_only: set[str]) -> str:
    return f"""
seen = {{line.split()[4] for line in open("/proc/self/mountinfo")}}
if seen & set({sorted(host_only)!r}):
    print({ESCAPED!r})
"""


def memory_program(processes: int, bytes_each: int) -> str:
    """Each of `processes` children fills `bytes_each` bytes (under the per-process limit) and holds them
    a moment; ESCAPED only when all of them held their share at the same time."""
    return f"""
import os, time
read, write = os.pipe()
children = []
for _ in range({processes}):
    pid = os.fork()
    if pid == 0:
        os.close(read)
        blob = b"\\x01" * {bytes_each}
        os.write(write, b"+")
        time.sleep(1)
        os._exit(0)
    children.append(pid)
os.close(write)
filled = b""
while len(filled) < {processes}:
    chunk = os.read(read, 16)
    if not chunk:
        break
    filled += chunk
alive = all(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in children)
if len(filled) == {processes} and alive:
    print({ESCAPED!r})
raise SystemExit(0 if alive else 1)
"""


# System V IPC through libc: Python's standard library has no binding for it.
_SYSV = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
IPC_CREAT, IPC_NOWAIT = 0o1000, 0o4000

class Message(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 128)]
"""


@contextlib.contextmanager
def sysv_keys() -> Iterator[tuple[int, int]]:
    """Fresh keys for a shared memory segment and a message queue; whatever they name on the host
    afterwards is removed (it is there only when a program left it behind)."""
    shm_key, msg_key = random.sample(range(0x5A000000, 0x5AFFFFFF), 2)
    try:
        yield shm_key, msg_key
    finally:
        ipcrm = shutil.which("ipcrm")
        if ipcrm:
            for flag, key in (("-M", shm_key), ("-Q", msg_key)):
                if key in sysv_keys_on_host(flag):
                    subprocess.run([ipcrm, flag, str(key)], check=False, capture_output=True)


def sysv_keys_on_host(kind: str) -> set[int]:
    """Keys of the host's shared memory segments ("-M") or message queues ("-Q")."""
    table = Path("/proc/sysvipc") / {"-M": "shm", "-Q": "msg"}[kind]
    return {int(line.split()[0]) for line in table.read_text().splitlines()[1:]}


def sysv_leave_program(shm_key: int, msg_key: int, shm_bytes: int, message: str) -> str:
    """Creates a shared memory segment (filled) and a queue holding `message`, and leaves both."""
    return _SYSV + f"""
shm = libc.shmget({shm_key}, {shm_bytes}, IPC_CREAT | 0o666)
address = libc.shmat(shm, None, 0)
ctypes.memset(address, 1, {shm_bytes})
queue = libc.msgget({msg_key}, IPC_CREAT | 0o666)
text = {message.encode()!r}
libc.msgsnd(queue, ctypes.byref(Message(1, text)), len(text), 0)
print("left", shm, queue)
"""


def sysv_read_program(msg_key: int) -> str:
    """Prints what a queue under `msg_key` holds (nothing when there is no such queue)."""
    return _SYSV + f"""
queue = libc.msgget({msg_key}, 0)
message = Message()
if queue >= 0 and libc.msgrcv(queue, ctypes.byref(message), 128, 0, IPC_NOWAIT) > 0:
    print(message.mtext.decode())
"""
