"""`zerobubble up [--config FILE] [--set KEY=VALUE] [rl_example.py flags] [--resume RUN_DIR | --overwrite]`."""

from __future__ import annotations

from pathlib import Path

from zerobubble.common.config import load_config, parse_override
from zerobubble.tooling.configs import DEMO as DEMO_CONFIG
from zerobubble.tooling.launcher.config import UpConfig
from zerobubble.tooling.launcher.reference_flags import add_reference_flags, reference_overrides
from zerobubble.tooling.launcher.run_folder import check_fresh, check_resume, nothing_left, saved_config


def up_config(args) -> UpConfig:
    """The demo config (or --config), then rl_example.py flags, then --set; --resume reloads a run's own."""
    overrides = reference_overrides(args)
    overrides.update(parse_override(item) for item in args.set or [])
    if args.resume is not None:
        return resumed_config(args.resume, overrides)
    # A missing file (the demo's included) is an error from load_config, never a run on the schema's defaults.
    return load_config(UpConfig, args.config or DEMO_CONFIG, overrides)


def resumed_config(run_dir: Path, overrides: dict) -> UpConfig:
    """The run's own config with `overrides`, refused when they change what the run's checkpoints hold."""
    path = saved_config(run_dir)
    config = load_config(UpConfig, path, overrides)
    check_resume(config, load_config(UpConfig, path))
    return config


def cmd_up(args) -> int:
    return launch(up_config(args), resume=args.resume is not None, overwrite=args.overwrite)


def launch(config: UpConfig, *, resume: bool, overwrite: bool) -> int:
    """Every check, then the run (for `up` and the Python API); ConfigError before anything starts."""
    from zerobubble.tooling.launcher.preflight import preflight

    if not resume:
        check_fresh(config, overwrite=overwrite)
    preflight(config)
    if resume and (reason := nothing_left(config)) is not None:
        print(f"zerobubble up: {reason}", flush=True)
        return 0
    # Imported once the input is known good: the pipeline brings torch, which a mistyped path need not wait for.
    from zerobubble.tooling.launcher.run import up

    return up(config, resume=resume, overwrite=overwrite)


def register(subparsers) -> None:
    parser = subparsers.add_parser("up", help="run the whole pipeline on this machine (default: the tiny CPU demo)")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="a run config (default: the demo, services/tooling/configs/demo.yaml)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a field, e.g. pipeline.rollout_workers=2 or trainer.max_steps=10")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a stopped run (same model)")
    start.add_argument("--overwrite", action="store_true",
                       help="replace the run that run_dir holds (its checkpoints, logs and metrics) with a new one")
    add_reference_flags(parser)
    parser.set_defaults(run=cmd_up)
