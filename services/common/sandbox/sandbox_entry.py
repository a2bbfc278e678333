"""Starts one sandboxed program: `python -I -S sandbox_entry.py STATUS_FD KEY=VALUE...`.

zerobubble.common.sandbox.runner runs it inside bubblewrap, which has already made the run's namespaces and
its minimal root. This process is still root in there, with no capability but CAP_SETUID and CAP_SETGID,
which it needs to start the program under the slot's uid. It runs in a fresh interpreter and imports
only the standard library (and not even json: its import would double the start-up time).

Process tree: bubblewrap's init (pid 1 of the run, which reaps orphans and whose exit takes down every
process left in the run) -> this process -> the program, a fork of this interpreter that drops to the slot's
user and limits and then runs main.py. The program is not pid 1 itself because pid 1
ignores every signal it has no handler for, SIGXCPU from the CPU limit included.

Keys: uid and the integer limits cpu_seconds, memory_bytes, max_processes, max_file_bytes,
max_open_files.

STATUS_FD gets lines for the service; the program's process closes it before main.py runs:
  error REASON        the program could not be started
  exit CODE CPU       the program ended: exit code or -signal, and the CPU seconds it used

`python -I -S sandbox_entry.py zygote CONTROL_FD CGROUP_FD KEY=VALUE...` is a slot's warm sandbox instead: a
long-lived process in the slot's bubblewrap sandbox (see zygote()) that starts each of the slot's programs in a
fresh world of its own, cheaper than a new bubblewrap sandbox and interpreter each time.
"""

import os
import resource
import sys


def report(status, line):
    os.write(status, (" ".join(line.split()) + "\n").encode())


def drop_privileges(spec):
    cpu = spec["cpu_seconds"]
    # The soft CPU limit sends SIGXCPU; the hard one, a second later, SIGKILL for a program that ignores it.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for limit, value in ((resource.RLIMIT_AS, spec["memory_bytes"]),
                         (resource.RLIMIT_NPROC, spec["max_processes"]),
                         (resource.RLIMIT_FSIZE, spec["max_file_bytes"]),
                         (resource.RLIMIT_NOFILE, spec["max_open_files"]),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    become(spec["uid"])


def become(uid):
    """Drops root for good: the uid, no supplementary groups, no way back (the environment service's episode
    processes use it too)."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise RuntimeError(f"uid {uid} could become root again")


def run_program(status, site_ready=False):
    """Runs main.py in this interpreter as `python -I main.py` would (a second interpreter's start-up was a
    third of a sandboxed run's time): site's builtins and paths (set up here unless `site_ready`), main.py as the
    __main__ module, an uncaught exception printed from main.py's frame on and ending the process with 1,
    SystemExit as itself. The status pipe is closed first, so the program never holds it. runpy is not used:
    importing it costs more than the start-up saved."""
    os.close(status)
    if not site_ready:
        import site

        site.main()
    path = os.path.abspath("main.py")  # as the interpreter makes a script's __file__ since 3.9
    main = type(sys)("__main__")
    main.__file__ = path
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["main.py"]
    code = None
    try:
        with open(path, "rb") as file:
            code = compile(file.read(), path, "exec")
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        trace = exc.__traceback__
        while trace is not None and trace.tb_frame.f_code is not code:  # a SyntaxError has no frame of main.py
            trace = trace.tb_next
        sys.excepthook(type(exc), exc.with_traceback(trace), trace)
        sys.exit(1)


INTEGERS = ("uid", "cpu_seconds", "memory_bytes", "max_processes", "max_file_bytes", "max_open_files")


def parse_spec(args):
    spec = dict(arg.partition("=")[::2] for arg in args)
    for key in INTEGERS:
        spec[key] = int(spec[key])
    return spec


# -- the warm slot -------------------------------------------------------------------------------------------------

# Namespaces of each program's own: its mounts (a fresh /tmp and /proc), processes (it sees only its own, and they
# all die with it), System V IPC (what a program leaves there goes with it) and cgroup view. The network and
# hostname namespaces are the slot's: no interface is up in it, and a program has no capability to change either.
_CLONE_NEWNS, _CLONE_NEWCGROUP, _CLONE_NEWIPC, _CLONE_NEWPID = 0x20000, 0x2000000, 0x8000000, 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 1, 2, 4, 8, 0x4000, 1 << 18
_PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_REQUEST_FDS = 5  # the program (a memfd), stdin, stdout, stderr, the status pipe


def zygote(control, cgroup, spec):
    """Starts the slot's programs, one at a time, as the host asks on CONTROL_FD (a Unix socket).

    This process is root in the slot's bubblewrap sandbox with CAP_SYS_ADMIN, CAP_SETPCAP, CAP_SETUID and
    CAP_SETGID; no program ever holds any of them. A request is the program's /tmp size in bytes, with five
    descriptors. For each, a fork of this process (the starter) moves itself into the slot's memory cgroup
    (CGROUP_FD: the slot's cgroup.procs, opened by the host), makes new mount, pid, IPC and cgroup namespaces,
    mounts a fresh tmpfs holding main.py on /tmp and forks the run's init: pid 1 of the new pid namespace, which
    mounts a fresh read-only /proc, starts the program as sandbox_entry's main() does and reports on the status
    pipe. When the init exits the kernel kills every process left in its namespace, and the last of them takes
    the run's /tmp and IPC objects along. This process closes a run's descriptors once the starter is forked,
    answers "started" and waits for the starter, which exits once the init is forked: the status pipe's end of
    file is the end of the run. The host kills the run through the slot's cgroup, and replaces this sandbox after
    any kill or failure.

    End of file on CONTROL_FD (the host closed it, or died) ends this process, and with it the slot's sandbox."""
    import site

    site.main()  # once here, not in every program: what it sets up is the same for all
    programs_modules = set(sys.modules)  # what a program finds imported, as in a fresh launcher
    import ctypes
    import socket

    libc = ctypes.CDLL(None, use_errno=True)
    channel = socket.socket(fileno=control)
    channel.sendall(b"ready")
    while True:
        message, fds, _, _ = socket.recv_fds(channel, 64, _REQUEST_FDS)
        if not message:
            os._exit(0)
        if len(fds) != _REQUEST_FDS or not message.isdigit():
            os._exit(1)  # not the host's protocol: the host sees the closed socket and replaces the slot
        starter = os.fork()
        if starter == 0:
            channel.close()
            start_run(libc, cgroup, spec, programs_modules, int(message), *fds)
        for fd in fds:
            os.close(fd)
        channel.sendall(b"started")
        os.waitpid(starter, 0)


def start_run(libc, cgroup, spec, programs_modules, tmp_bytes, program, stdin, stdout, stderr, status):
    """The starter: the run's cgroup, namespaces and /tmp, then its init. Never returns."""
    try:
        os.write(cgroup, b"0")
        os.close(cgroup)
        call(libc.unshare, _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWCGROUP)
        call(libc.mount, None, b"/", None, _MS_REC | _MS_PRIVATE, None)
        call(libc.mount, b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=%d,mode=1777" % tmp_bytes)
        # As bubblewrap's --file makes it: root's and read-only, so the program cannot replace it.
        main_py = os.open("/tmp/main.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        while os.sendfile(main_py, program, None, 1 << 20):
            pass
        os.close(main_py)
        os.close(program)
        os.chdir("/tmp")
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        if os.fork() == 0:
            run_init(libc, spec, programs_modules, status)
    except Exception as exc:
        report(status, f"error {exc}")
        os._exit(1)
    os._exit(0)


def run_init(libc, spec, programs_modules, status):
    """Pid 1 of the run: its /proc, the program, and the report once the program has ended. Never returns."""
    try:
        call(libc.mount, b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY, None)
        program = os.fork()
    except Exception as exc:
        report(status, f"error {exc}")
        os._exit(1)
    if program == 0:
        try:
            drop_bounding_set(libc)
            drop_privileges(spec)
            clear_capabilities(libc)
            # Nothing of this process's past but the status pipe, which run_program closes.
            os.closerange(3, status)
            os.closerange(status + 1, 1 << 20)
            for name in set(sys.modules) - programs_modules:
                del sys.modules[name]
        except Exception as exc:
            report(status, f"error {exc}")
            os._exit(1)
        try:
            run_program(status, site_ready=True)
            code = 0
        except SystemExit as exc:
            code = exit_code(exc)
        exit_as_the_interpreter_does(code)
    null = os.open("/dev/null", os.O_RDWR)  # the program's pipes reach end of file when its processes end
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)
    wait_and_report(program, status)


def wait_and_report(program, status):
    """Reaps whatever ends (as pid 1 it inherits the program's orphans) until the program has ended."""
    try:
        while True:
            pid, wait_status, usage = os.wait4(-1, 0)
            if pid == program:
                break
    except Exception as exc:
        report(status, f"error {exc}")
        os._exit(1)
    code = os.waitstatus_to_exitcode(wait_status)
    report(status, f"exit {code} {usage.ru_utime + usage.ru_stime:.3f}")
    os._exit(0)


def exit_code(exc):
    """The status the interpreter exits with for an uncaught SystemExit (it prints any code but None or an int)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    try:
        print(exc.code, file=sys.stderr)
    except Exception:
        pass
    return 1


def exit_as_the_interpreter_does(code):
    """Ends the program as the interpreter's exit would, in what the program can see: its non-daemon threads
    joined, its exit handlers run, its standard streams flushed (120 when that fails). The interpreter's own
    teardown is skipped: in a fork of the zygote it frees the whole inherited heap, copying every page it
    touches, and took longer than the program it followed."""
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass  # as at exit: what goes wrong in a handler is reported there and ends nothing
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception:
            code = 120
    os._exit(code)


def drop_bounding_set(libc):
    """Empties the bounding set, so that nothing the program runs can ever gain a capability."""
    cap = 0
    while libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if cap == 0:
        raise OSError(ctypes_errno(), "cannot drop the capability bounding set")


def clear_capabilities(libc):
    """Empties the inheritable set (bubblewrap fills it with the zygote's), which the new uid left alone."""
    import ctypes

    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    call(libc.capset, header, (ctypes.c_uint32 * 6)())


def call(function, *args):
    if function(*args) != 0:
        errno = ctypes_errno()
        raise OSError(errno, f"{function.__name__}: {os.strerror(errno)}")


def ctypes_errno():
    import ctypes

    return ctypes.get_errno()


def main():
    if sys.argv[1] == "zygote":
        zygote(int(sys.argv[2]), int(sys.argv[3]), parse_spec(sys.argv[4:]))
    status = int(sys.argv[1])
    spec = parse_spec(sys.argv[2:])
    os.set_inheritable(status, False)
    try:
        program = os.fork()
    except OSError as exc:
        report(status, f"error {exc}")
        os._exit(1)
    if program == 0:
        try:
            drop_privileges(spec)
        except Exception as exc:
            report(status, f"error {exc}")
            os._exit(1)
        run_program(status)
        return
    try:
        _, wait_status, usage = os.wait4(program, 0)
    except Exception as exc:
        report(status, f"error {exc}")
        os._exit(1)
    code = os.waitstatus_to_exitcode(wait_status)
    report(status, f"exit {code} {usage.ru_utime + usage.ru_stime:.3f}")
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
