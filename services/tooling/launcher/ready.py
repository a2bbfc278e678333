"""How a service tells `zerobubble up` that it serves, and where: its address line written to a file that the
launcher names in the environment. Not stdout: libraries print there what they like (vLLM its log lines, before
the service is ready), and the launcher must not take one of those for the address.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

READY_FILE = "ZEROBUBBLE_READY_FILE"


def announce(ready: dict) -> None:
    """In a service that `zerobubble up` started (it says so in the environment): write its address line there,
    whole or not at all, so the launcher never reads half of it."""
    path = os.environ.pop(READY_FILE, None)
    if path is None:
        return
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as out:
        out.write(json.dumps(ready) + "\n")
    os.replace(partial, path)


def read_announcement(path: Path) -> dict | None:
    """The address line at `path` once the service has written it, else None; ValueError when it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    ready = json.loads(text)
    if not isinstance(ready, dict) or not isinstance(ready.get("address"), str):
        raise ValueError(f"expected a JSON object with an address, got {text[:200]!r}")
    return ready
