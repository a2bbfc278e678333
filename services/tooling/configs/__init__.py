"""Configurations shipped with the package (package data, so an installed wheel has them too)."""

from pathlib import Path

DIRECTORY = Path(__file__).parent
# What `zerobubble up` runs when no --config is given: the tiny CPU demo.
DEMO = DIRECTORY / "demo.yaml"
# What it starts from when the user gives their own model or data without a --config.
GENERAL = DIRECTORY / "general.yaml"


def named(config: Path) -> Path:
    """A --config value: a file, or the name of a shipped config (`demo`, `general`,
    `qwen2.5-0.5b-instruct-gsm8k`)."""
    shipped = DIRECTORY / f"{config}.yaml"
    if not config.exists() and config.parent == Path(".") and shipped.is_file():
        return shipped
    return config


def shipped_names() -> list[str]:
    return sorted(path.stem for path in DIRECTORY.glob("*.yaml"))
