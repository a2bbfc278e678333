"""`zerobubble bench openai` at a small scale, through the command: agent sessions calling at once through both
paths of the endpoint's calls in one run, the batched one seen to decode the sessions side by side and to reuse
each session's cache for its next call."""

from __future__ import annotations

import json
import subprocess
import sys

SESSIONS, CALLS = 4, 3


def test_bench_openai_reports_both_paths_and_what_the_batcher_did():
    result = subprocess.run(
        [sys.executable, "-m", "zerobubble", "bench", "openai", "--sessions", str(SESSIONS), "--calls", str(CALLS),
         "--max-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    for path in ("locked", "batched"):
        assert figures[path]["calls_per_s"] > 0 and figures[path]["completion_tokens_per_s"] > 0, figures
    assert figures["ratio_calls_per_s"] == round(figures["batched"]["calls_per_s"] / figures["locked"]["calls_per_s"],
                                                 2)
    batcher = figures["batcher"]
    # Every session's calls after its first extend its conversation: the kept caches spare their prefill. The
    # sessions' first calls, made at once, share decode steps.
    assert batcher["peak_running"] >= 2, batcher
    assert batcher["reused_tokens"] > SESSIONS * (CALLS - 1), batcher
