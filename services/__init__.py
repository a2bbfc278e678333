"""Zerobubble: RL fine-tuning on verifiable rewards as four gRPC services. `zerobubble.run(config)` is `zerobubble
up` from Python (services/tooling/launcher/api.py)."""


def run(*args, **kwargs):
    """See zerobubble.tooling.launcher.api.run (imported on call: importing the package stays light)."""
    from zerobubble.tooling.launcher.api import run as _run

    return _run(*args, **kwargs)
