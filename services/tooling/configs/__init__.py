"""Configurations shipped with the package (package data, so an installed wheel has them too)."""

from pathlib import Path

DIRECTORY = Path(__file__).parent
# What `zerobubble up` runs when no --config is given: the tiny CPU demo.
DEMO = DIRECTORY / "demo.yaml"
