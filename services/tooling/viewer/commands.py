"""The `view` command."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import ValidationError

from zerobubble.common.config import ConfigError
from zerobubble.tooling.viewer.config import ViewConfig


def register(subparsers) -> None:
    parser = subparsers.add_parser("view", help="browse a run in a local web page")
    parser.add_argument("run_dir", type=Path, help="the run folder (finished or still running)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free one)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME", dest="allowed_hosts",
                        help="a name the page is opened by besides localhost and --host (repeatable)")
    parser.add_argument("--max-line-bytes", type=int, default=None, help="skip longer lines of the run's files")
    parser.set_defaults(run=_cmd_view)


def _cmd_view(args) -> int:
    try:
        config = ViewConfig(run_dir=args.run_dir, host=args.host, port=args.port, allowed_hosts=args.allowed_hosts,
                            **({"max_line_bytes": args.max_line_bytes} if args.max_line_bytes else {}))
    except ValidationError as exc:
        error = exc.errors()[0]
        raise ConfigError(f"view: {error['loc'][0]}: {error['msg']}") from None
    from zerobubble.tooling.viewer.server import serve

    try:
        asyncio.run(serve(config))
    except KeyboardInterrupt:
        pass
    except OSError as exc:  # the port is taken, or the address is not this machine's
        raise ConfigError(f"view: cannot listen on {config.host}:{config.port}: {exc.strerror}") from None
    return 0
