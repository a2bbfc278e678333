"""What the services that run users' code in worker processes share (the reward service's custom verifiers, the
environment service's environments and tools): importing `module:name` from an optional folder, showing a value
in a reason without trusting it, and the environment a worker process gets."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Collection
from typing import Any

# What any program needs to run; everything else of the service's environment (its token) stays out.
BASIC_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH")
_SHOWN_CHARS = 200


def import_callable(function: str, path: str | None) -> Callable:
    """The callable `module:name`, importing the module from `path` first when given."""
    if path is not None and path not in sys.path:
        sys.path.insert(0, path)
    module_name, _, name = function.partition(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - a module that exits or fails at import is a config error
        raise ImportError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    target = getattr(module, name, None)
    if target is None:
        raise ImportError(f"module {module_name!r} has no {name!r}")
    if not callable(target):
        raise ImportError(f"{function} is a {type(target).__name__}, not a callable")
    return target


def shown(value: Any) -> str:
    """`str(value)`, cut to a few hundred characters, for a reason or a log line; never raises."""
    try:
        text = str(value)
    except Exception:  # noqa: BLE001 - an object whose str() fails still gets a reason
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def refuse_token_in_env(token_env: str | None, env: Collection[str], field: str, who: str) -> None:
    """Raise ValueError naming `field` when the variables passed on to the workers (`env`) would hand users' code
    (`who`) the one holding the service's bearer token."""
    if token_env is not None and token_env in env:
        raise ValueError(f"{field}: {token_env!r} holds the bearer token (server.auth_token_env); {who} must not "
                         "get it")
