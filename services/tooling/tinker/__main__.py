"""`python -m zerobubble.tooling.tinker --config FILE [--set KEY=VALUE ...]`: serve the Tinker API."""

from __future__ import annotations

import argparse
import logging

from zerobubble.common.config import ConfigError, is_loopback, load_config
from zerobubble.tooling.tinker.config import TinkerServerConfig

log = logging.getLogger("zerobubble.tooling.tinker")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="serve the Tinker training API over Zerobubble's trainer and engine")
    parser.add_argument("--config", help="a YAML file of TinkerServerConfig")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a dotted override")
    args = parser.parse_args(argv)
    try:
        config = load_config(TinkerServerConfig, args.config, args.set)
        token = config.auth.bearer_token()
    except ConfigError as exc:
        parser.exit(2, f"{exc}\n")  # before torch loads: a wrong setting is named at once

    import uvicorn

    from zerobubble.common.asgi_guard import deadline_protocol
    from zerobubble.tooling.tinker.app import create_app
    from zerobubble.tooling.tinker.service import TinkerService

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if token is None and not is_loopback(config.listen):
        log.warning("%s answers every caller that reaches it: no bearer token is set (auth.auth_token_file or "
                    "auth.auth_token_env)", config.listen)
    host, port = config.listen.rsplit(":", 1)
    app = create_app(TinkerService(config))
    log.info("Tinker API on http://%s/ serving %s", config.listen, config.model_name)
    uvicorn.run(app, host=host, port=int(port), log_level="warning", http=deadline_protocol(config.request_deadline_s))


if __name__ == "__main__":
    main()
