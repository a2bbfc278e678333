"""How an episode ends when the rollout ends it (its record is common/trajectory.py's EpisodeRecord)."""

from __future__ import annotations

DONE = "done"                 # the environment said so
MAX_TURNS = "max_turns"
MAX_TOKENS = "max_tokens"     # run_spec.max_new_tokens, the whole response's budget
# Ends that cut the episode short, as a length limit cuts a single response: counted as truncated.
TRUNCATING = frozenset({MAX_TURNS, MAX_TOKENS})
