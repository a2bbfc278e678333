"""The Tinker training API (as the official `tinker` client speaks it) served by Zerobubble's own trainer and
rollout code: LoRA training clients on one base model, sampling clients at saved weights, futures the client polls.
docs/guides/tinker.md says how to use it and what of the API is not served."""
