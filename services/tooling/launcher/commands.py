"""`zerobubble up [--config FILE|NAME] [--set KEY=VALUE] [rl_example.py flags] [--resume RUN_DIR | --overwrite]
[--dry-run]`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from zerobubble.common.config_tree import ConfigError, parse_override
from zerobubble.tooling.configs import DEMO, GENERAL, named, shipped_names
from zerobubble.tooling.launcher.early_refusal import refuse_missing_paths, refuse_mistyped, remember_keys
from zerobubble.tooling.launcher.reference_flags import add_reference_flags, reference_flags, reference_overrides

if TYPE_CHECKING:
    from zerobubble.tooling.launcher.config import UpConfig

# The schemas (pydantic, and every service's) are imported once the early refusal has passed: building them takes
# longer than refusing a mistyped key needs.


def base_config(args, overrides: dict) -> Path:
    """The file a run starts from: the run's own on --resume, --config (a file or a shipped config's name), the
    demo when nothing of the user's is given, and the general default for a user's own model or data."""
    if args.resume is not None:
        from zerobubble.tooling.launcher.run_folder import saved_config

        return saved_config(args.resume)
    if args.config is not None:
        path = named(args.config)
        if not path.exists():
            raise ConfigError(f"--config {args.config}: no such file, and no shipped config of that name "
                              f"({', '.join(shipped_names())})")
        return path
    return GENERAL if "model" in overrides or "train_data" in overrides else DEMO


def up_sources(args) -> tuple[Path, dict]:
    """The base config, and the rl_example.py flags and --set on top of it."""
    overrides = reference_overrides(args)
    overrides.update(parse_override(item) for item in args.set or [])
    return base_config(args, overrides), overrides


def up_config(args) -> UpConfig:
    """The base config, then rl_example.py flags, then --set."""
    base, overrides = up_sources(args)
    refuse_mistyped("up", "UpConfig", base, overrides)
    from zerobubble.common.config import load_config
    from zerobubble.tooling.launcher.config import UpConfig, up_key_tree
    from zerobubble.tooling.launcher.run_folder import check_resume

    try:
        config = load_config(UpConfig, base, overrides)
    finally:
        remember_keys("up", up_key_tree())
    if args.resume is not None:
        # Refused when the overrides change what the run's checkpoints hold.
        check_resume(config, load_config(UpConfig, base))
    return config


def cmd_up(args) -> int:
    refuse_missing_paths("up", *up_sources(args))
    config = up_config(args)
    from zerobubble.tooling.launcher.preflight import preflight
    from zerobubble.tooling.launcher.run_folder import check_fresh, nothing_left

    resume = args.resume is not None
    if not resume:
        check_fresh(config, overwrite=args.overwrite)
    derived = preflight(config, environments=args.dry_run)
    print(effective_run(args, config, derived), flush=True)
    if args.dry_run:
        print("zerobubble up: --dry-run: nothing was started", flush=True)
        return 0
    if resume and (reason := nothing_left(config)) is not None:
        print(f"zerobubble up: {reason}", flush=True)
        return 0
    # Imported once the input is known good: the pipeline brings torch, which a mistyped path need not wait for.
    from zerobubble.tooling.launcher.run import up

    return up(config, resume=resume, overwrite=args.overwrite)


def register(subparsers) -> None:
    parser = subparsers.add_parser("up", help="run the whole pipeline on this machine (default: the tiny CPU demo)")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="a run config, or the name of a shipped one (" + ", ".join(shipped_names()) + "); "
                             "default: the demo, or `general` when -m or -d is given")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a field, e.g. pipeline.rollout_workers=2 or trainer.max_steps=10")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a stopped run (same model)")
    start.add_argument("--overwrite", action="store_true",
                       help="replace the run that run_dir holds (its checkpoints, logs and metrics) with a new one")
    parser.add_argument("--dry-run", action="store_true",
                        help="print every setting that differs from its default, where it came from and what is "
                             "derived, check the run as `up` would (its environments loaded, MCP servers' tools "
                             "listed, OpenEnv servers asked), and exit without starting anything")
    add_reference_flags(parser)
    parser.set_defaults(run=cmd_up)


def effective_run(args, config: UpConfig, derived: list) -> str:
    """Every setting of the run that differs from its default, where it came from, and what `up` derives."""
    from zerobubble.tooling.launcher.effective import effective_settings, render

    overrides = reference_overrides(args)
    sets = dict(parse_override(item) for item in args.set or [])
    base = base_config(args, {**overrides, **sets})
    settings = effective_settings(config, base, reference_flags(args), sets)
    return f"zerobubble up: the run from {base}, where it differs from the defaults:\n{render(settings + derived)}"
