"""CPU seconds of other processes, so a bench can say how many of the machine's cores its parts kept busy."""

from __future__ import annotations

import os
from pathlib import Path


def process_cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds of a process so far, all its threads (from /proc); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces: the fields are counted from after it.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
