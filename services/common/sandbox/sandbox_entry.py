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


def run_program(status):
    """Runs main.py in this interpreter as `python -I main.py` would (a second interpreter's start-up was a
    third of a sandboxed run's time): site's builtins and paths, main.py as the __main__ module, an uncaught
    exception printed from main.py's frame on and ending the process with 1, SystemExit as itself. The
    status pipe is closed first, so the program never holds it. runpy is not used: importing it costs more
    than the start-up saved."""
    os.close(status)
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


def main():
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
