"""Fixtures of the rollout tests: the tiny models the engines run, and one torch thread per test module
(two threads contending for a shared 2-core machine are many times slower than one)."""

from engine_cases import one_torch_thread, other_varied_model, tiny_model, varied_model  # noqa: F401
