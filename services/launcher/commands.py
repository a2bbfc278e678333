"""`zerobubble up [--config FILE] [--set KEY=VALUE] [rl_example.py flags] [--resume RUN_DIR]`."""

from __future__ import annotations

from pathlib import Path

from zerobubble.common.config import ConfigError, load_config, parse_override
from zerobubble.launcher.config import UpConfig
from zerobubble.launcher.reference_flags import add_reference_flags, reference_overrides

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


def up_config(args) -> UpConfig:
    """The demo config (or --config), then rl_example.py flags, then --set; --resume reloads a run's own."""
    overrides = reference_overrides(args)
    processes = overrides.pop("trainer_processes", 1)
    if processes != 1:
        raise ConfigError(f"--num-trainers {processes}: `zerobubble up` runs one trainer process; for data "
                          "parallel training start `zerobubble serve trainer` under torchrun")
    overrides.update(parse_override(item) for item in args.set or [])
    if args.resume is not None:
        path = args.resume / "configs" / "up.yaml"
        if not path.exists():
            raise ConfigError(f"--resume {args.resume}: no run there ({path} is missing)")
        return load_config(UpConfig, path, overrides)
    path = args.config or (DEMO_CONFIG if DEMO_CONFIG.exists() else None)
    return load_config(UpConfig, path, overrides)


def cmd_up(args) -> int:
    from zerobubble.launcher.preflight import preflight

    config = up_config(args)
    preflight(config)
    # Imported once the input is known good: the pipeline brings torch, which a mistyped path need not wait for.
    from zerobubble.launcher.run import up

    return up(config, resume=args.resume is not None)


def register(subparsers) -> None:
    parser = subparsers.add_parser("up", help="run the whole pipeline on this machine (default: the tiny CPU demo)")
    parser.add_argument("--config", type=Path, metavar="FILE", help="a run config (default: configs/demo.yaml)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a field, e.g. pipeline.rollout_workers=2 or trainer.max_steps=10")
    parser.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a stopped run")
    add_reference_flags(parser)
    parser.set_defaults(run=cmd_up)
