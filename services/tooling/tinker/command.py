"""`zerobubble tinker --config FILE [--set KEY=VALUE ...]`: serve the Tinker API (also `python -m
zerobubble.tooling.tinker`)."""

from __future__ import annotations

import logging

log = logging.getLogger("zerobubble.tooling.tinker")


def register(subparsers) -> None:
    parser = subparsers.add_parser("tinker", help="serve the Tinker training API over Zerobubble's trainer and "
                                   "engine")
    parser.add_argument("--config", help="a YAML file of TinkerServerConfig (`zerobubble config` has no entry for "
                        "it: docs/guides/tinker.md lists its settings)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a dotted override")
    parser.set_defaults(run=cmd_tinker)


def cmd_tinker(args) -> int:
    """Serves until stopped; a wrong setting is a ConfigError naming it, before torch loads."""
    from zerobubble.common.config import is_loopback, load_config
    from zerobubble.tooling.tinker.config import TinkerServerConfig

    config = load_config(TinkerServerConfig, args.config, args.set)
    token = config.auth.bearer_token()

    import torch
    import uvicorn

    from zerobubble.common.asgi_guard import deadline_protocol
    from zerobubble.tooling.tinker.app import create_app
    from zerobubble.tooling.tinker.service import TinkerService

    if token is None and not is_loopback(config.listen):
        log.warning("%s answers every caller that reaches it: no bearer token is set (auth.auth_token_file or "
                    "auth.auth_token_env)", config.listen)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    host, port = config.listen.rsplit(":", 1)
    app = create_app(TinkerService(config))
    log.info("Tinker API on http://%s/ serving %s", config.listen, config.model_name)
    uvicorn.run(app, host=host, port=int(port), log_level="warning", http=deadline_protocol(config.request_deadline_s))
    return 0

