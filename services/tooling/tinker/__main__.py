"""`python -m zerobubble.tooling.tinker --config FILE [--set KEY=VALUE ...]`: `zerobubble tinker`."""

from __future__ import annotations

import sys

from zerobubble.tooling.cli import main

if __name__ == "__main__":
    sys.exit(main(["tinker", *sys.argv[1:]]))
