"""Launcher for one sandboxed run: `python -I -S sandbox_entry.py STATUS_FD KEY=VALUE...`, started as root
by zerobubble.reward.sandbox. It runs in a fresh interpreter, so it imports only the standard library (and
not even json: its import would double the launcher's start-up time).

Process tree: this process (outside the new pid namespace) -> init (pid 1 inside it, still root) ->
the program (slot uid). init reaps orphans and exits as soon as the program does; the kernel then kills
whatever is left in the namespace. The program is not pid 1 itself because pid 1 ignores every signal it
has no handler for, SIGXCPU from the CPU limit included.

Keys: workdir, python, uid (empty: keep our uid), mode ("require": every isolation step must succeed;
"try": report failed steps and go on, used by the probe; "off": no namespaces), and the integer limits
cpu_seconds, memory_bytes, max_processes, max_file_bytes, max_open_files.

STATUS_FD gets lines for the service; it is close-on-exec, so the program never holds it:
  fail STEP: REASON   an isolation step failed in "try" mode
  error REASON        the launcher gave up; the program did not run
  exit CODE CPU       the program ended: exit code or -signal, and the CPU seconds it used
"""

import ctypes
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1 << 10
MS_NODIRATIME = 1 << 11
MS_BIND = 1 << 12
MS_REC = 1 << 14
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
PR_SET_NO_NEW_PRIVS = 38

# A read-only remount replaces a mount's flags, so it has to repeat the ones the mount already has.
KEPT_FLAGS = {b"nosuid": MS_NOSUID, b"nodev": MS_NODEV, b"noexec": MS_NOEXEC, b"noatime": MS_NOATIME,
              b"nodiratime": MS_NODIRATIME, b"relatime": MS_RELATIME}

libc = ctypes.CDLL(None, use_errno=True)
libc.unshare.argtypes = [ctypes.c_int]
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4


def check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def report(status, line):
    os.write(status, (" ".join(line.split()) + "\n").encode())


def step(spec, status, name, action):
    """Runs one isolation step; a failure is fatal unless the mode is "try"."""
    try:
        action()
    except OSError as exc:
        if spec["mode"] != "try":
            raise RuntimeError(f"{name}: {exc.strerror}") from exc
        report(status, f"fail {name}: {exc.strerror}")
        return False
    return True


def lock_filesystem(spec):
    """Makes every mount read-only and puts the program alone on a private tmpfs mounted on /tmp."""
    with open(os.path.join(spec["workdir"], "main.py"), "rb") as f:
        source = f.read()  # before anything is mounted over the path it was written to
    # Nothing done below may propagate back to the host's mounts.
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    with open("/proc/self/mountinfo", "rb") as f:
        mounts = [line.split(b" ") for line in f]
    for fields in mounts:
        target = fields[4].decode("unicode_escape").encode("latin-1")  # undo the \040-style escapes
        options = fields[5].split(b",")
        if b"ro" not in options:
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY
            for option in options:
                flags |= KEPT_FLAGS.get(option, 0)
            what = f"remount {target.decode(errors='replace')} read-only"
            check(libc.mount(None, target, None, flags, None), what)
    # A proc of the new pid namespace: the host's processes (and their command lines) disappear.
    check(libc.mount(b"proc", b"/proc", b"proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
          "mount /proc")
    # A fresh /tmp hides the host's and, unlike the workdir's own path, every user can reach it (Python
    # opens the program by its absolute path). Its size bounds all that is written (RLIMIT_FSIZE bounds
    # one file only), and it vanishes with the namespace.
    size = len(source) + spec["max_file_bytes"] + 4096
    uid = spec["uid"]
    options = f"size={size},nr_inodes=1024,mode=0700,uid={uid},gid={uid}".encode()
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, options), "mount /tmp")
    with open("/tmp/main.py", "wb") as f:
        f.write(source)
    os.chown("/tmp/main.py", uid, uid)


def exec_program(spec):
    cpu = spec["cpu_seconds"]
    # The soft CPU limit sends SIGXCPU; the hard one, a second later, SIGKILL for a program that ignores it.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for limit, value in ((resource.RLIMIT_AS, spec["memory_bytes"]),
                         (resource.RLIMIT_NPROC, spec["max_processes"]),
                         (resource.RLIMIT_FSIZE, spec["max_file_bytes"]),
                         (resource.RLIMIT_NOFILE, spec["max_open_files"]),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    # Setuid binaries (su, mount...) grant nothing from here on.
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")
    uid = spec["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise RuntimeError("the program's user could become root again")
    python = spec["python"]
    os.execve(python, [python, "-I", "main.py"], os.environ)


def run_init(spec, status, isolated):
    locked = isolated and step(spec, status, "filesystem", lambda: lock_filesystem(spec))
    os.chdir("/tmp" if locked else spec["workdir"])
    os.environ["HOME"] = os.getcwd()
    program = os.fork()
    if program == 0:
        exec_program(spec)
    while True:
        pid, wait_status, usage = os.wait4(-1, 0)
        if pid == program:
            break
    code = os.waitstatus_to_exitcode(wait_status)
    report(status, f"exit {code} {usage.ru_utime + usage.ru_stime:.3f}")
    os._exit(code if code >= 0 else 128 - code)


def run(spec, status):
    isolated = spec["mode"] != "off"
    if isolated:
        namespaces = (("mount namespace", CLONE_NEWNS), ("network namespace", CLONE_NEWNET),
                      ("pid namespace", CLONE_NEWPID))
        # Every step runs, even after a failure, so that the probe reports all that is missing.
        done = [step(spec, status, name, lambda flag=flag: check(libc.unshare(flag), "unshare"))
                for name, flag in namespaces]
        isolated = all(done)
    init = os.fork()  # the first child of a new pid namespace is its pid 1
    if init == 0:
        run_init(spec, status, isolated)
    code = os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])
    os._exit(code if code >= 0 else 128 - code)


INTEGERS = ("cpu_seconds", "memory_bytes", "max_processes", "max_file_bytes", "max_open_files")


def parse_spec(args):
    spec = dict(arg.partition("=")[::2] for arg in args)
    for key in INTEGERS:
        spec[key] = int(spec[key])
    spec["uid"] = int(spec["uid"]) if spec["uid"] else None
    return spec


def main():
    status = int(sys.argv[1])
    spec = parse_spec(sys.argv[2:])
    os.set_inheritable(status, False)
    try:
        run(spec, status)
    except Exception as exc:  # in any of the three processes: the program must not run
        report(status, f"error {exc}")
    os._exit(1)


if __name__ == "__main__":
    main()
