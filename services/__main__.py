"""`python -m zerobubble`, the same as the `zerobubble` command."""

from zerobubble.tooling.cli import main

# Guarded: worker processes started by spawn import this module again under another name.
if __name__ == "__main__":
    raise SystemExit(main())
