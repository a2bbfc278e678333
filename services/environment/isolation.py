"""How the parent of the episodes' processes is started under isolation (workers.isolation): in bubblewrap's process
and IPC namespaces (a fresh /proc, where the service's processes and their environment variables are not), seeing the
host's files as they are, with no capability but the two it needs to become workers.uid before it imports anything
of the user's (worker.py). Files keep their modes: what workers.uid may not read stays unreadable, except that a
folder only root may enter (a home of 0700 holding the interpreter or the virtual environment) is replaced by an
empty one in which the folders the environments need (the interpreter's, sys.path's, the entries' folders, the
working directory) are bound."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

from zerobubble.common.config import ConfigError
from zerobubble.environment.config import EnvironmentConfig, WorkersConfig

_NAMESPACES = ("--unshare-pid", "--unshare-ipc", "--die-with-parent", "--bind", "/", "/", "--proc", "/proc",
               "--dev-bind", "/dev", "/dev")
_CAPABILITIES = ("--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID")


def isolation_of(workers: WorkersConfig, entries: list[EnvironmentConfig]) -> tuple[bool, str]:
    """Whether the episodes' processes run isolated, and what is missing where they do not (workers.isolation: on
    raises ConfigError instead)."""
    if workers.isolation == "off":
        return False, "workers.isolation is off"
    missing = []
    if os.geteuid() != 0:
        missing.append("the service does not run as root")
    if shutil.which("bwrap") is None:
        missing.append("bubblewrap is not installed (apt-get install bubblewrap)")
    closed = unreadable(entries)
    if closed:
        missing.append(f"{closed[0]} is not readable by others, so not by workers.uid={workers.uid} (chmod o+rx "
                       "it, or set workers.isolation: off)")
    if missing and workers.isolation == "on":
        raise ConfigError(f"workers.isolation: on, but {'; '.join(missing)}")
    return not missing, "; ".join(missing)


def needed_paths(entries: list[EnvironmentConfig]) -> list[Path]:
    """The folders the parent reads: the interpreter's, sys.path's, PYTHONPATH's, the entries' and the working
    directory."""
    found = [Path(sys.executable).resolve().parent, Path(sys.base_prefix), Path(sys.prefix), Path.cwd(),
             *(Path(item) for item in sys.path if item),
             *(Path(item) for item in os.environ.get("PYTHONPATH", "").split(os.pathsep) if item),
             *(entry.path for entry in entries if entry.path is not None)]
    return sorted({path.resolve() for path in found if path.exists()}, key=lambda path: len(path.parts))


def unreadable(entries: list[EnvironmentConfig]) -> list[Path]:
    """The folders the parent needs that workers.uid could not read (theirs modes, not their parents')."""
    return [path for path in needed_paths(entries)
            if path.is_dir() and (path.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH)) != stat.S_IROTH | stat.S_IXOTH]


def bwrap_command(entries: list[EnvironmentConfig]) -> list[str]:
    """bubblewrap and its options, up to the command it runs."""
    hidden: list[Path] = []
    bound: list[Path] = []
    for path in needed_paths(entries):
        closed = next((parent for parent in reversed(path.parents) if not _enterable(parent)), None)
        if closed is None:
            continue
        if not any(closed.is_relative_to(done) for done in hidden):
            hidden.append(closed)
        bound.append(path)
    options = [shutil.which("bwrap"), *_NAMESPACES]
    # Folders made on the empty ones, up to each bound one, enterable (bubblewrap's own follow the umask).
    made = sorted({parent for path in bound for parent in path.parents
                   if any(parent.is_relative_to(folder) and parent != folder for folder in hidden)},
                  key=lambda path: len(path.parts))
    for folder in hidden:
        options += ["--perms", "0755", "--tmpfs", str(folder)]
    for folder in made:
        options += ["--perms", "0755", "--dir", str(folder)]
    for folder in bound:
        options += ["--bind", str(folder), str(folder)]
    return [*options, *_CAPABILITIES, "--"]


def _enterable(folder: Path) -> bool:
    return bool(folder.stat().st_mode & stat.S_IXOTH)
