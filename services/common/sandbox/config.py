"""The code sandbox's limits and isolation (its defaults are here)."""

from __future__ import annotations

import os

from pydantic import Field

from zerobubble.common.config import Schema


class SandboxConfig(Schema):
    """Limits and isolation for running submitted programs (see README, 'Code sandbox')."""

    python: str = Field("python3", description="interpreter that runs submitted programs; it and its "
                        "libraries must live under /usr, the only host folder a program sees")
    bwrap: str = Field("bwrap", description="bubblewrap, which builds each run's namespaces and root (a path "
                       "or a name on PATH); without it the code verifier is off")
    slots: int = Field(default_factory=lambda: os.cpu_count() or 1, gt=0,
                       description="programs run at once; each slot has its own user id and memory cgroup")
    uid_base: int = Field(61000, ge=1000, description="slot i runs as uid/gid uid_base + i")
    warm_slots: bool = Field(True, description="each slot keeps its bubblewrap sandbox and launcher between runs "
                             "and gives each run fresh namespaces and a fresh /tmp in it (false: a new bubblewrap "
                             "sandbox per run)")
    wall_seconds: float = Field(10.0, gt=0)
    cpu_seconds: int = Field(10, gt=0)
    memory_bytes: int = Field(512 * 1024 * 1024, gt=0, description="memory of a whole run (a cgroup: all its "
                              "processes, its files in /tmp, its shared memory), and each process's address space")
    max_processes: int = Field(16, gt=0, description="processes the slot's user may own")
    max_file_bytes: int = Field(16 * 1024 * 1024, ge=0, description="largest file it may write")
    max_output_bytes: int = Field(1024 * 1024, gt=0, description="stdout and stderr are cut (and the run "
                                  "killed) past this")
    max_open_files: int = Field(64, gt=3)
