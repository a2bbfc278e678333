"""Building a copy of the documentation site strictly, as `make docs` does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = shutil.which("mkdocs", path=str(Path(sys.executable).parent))


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([MKDOCS, "build", "--strict", "-f", str(config), "-d", str(site)], cwd=config.parent,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
