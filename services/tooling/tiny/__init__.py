"""A tiny Qwen2-architecture model made locally, a synthetic arithmetic task, and a short supervised warm start."""
