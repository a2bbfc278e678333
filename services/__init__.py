"""Zerobubble: reinforcement-learning fine-tuning on verifiable rewards as independent gRPC services.

`zerobubble.launch(...)` starts and follows a run from Python (services/tooling/api.py); the `zerobubble` command
does the same from a shell."""


def launch(config=None, **settings):
    """See zerobubble.tooling.api.launch (imported when called: the light install has no launcher)."""
    from zerobubble.tooling.api import launch as _launch

    return _launch(config, **settings)
