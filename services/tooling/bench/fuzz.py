"""`zerobubble bench fuzz --seconds N`: the fuzz suite as a soak. Rounds of generated messages to every RPC
(new ones each round) and of the stream and wire abuse, until the time is up; a service that dies is counted
and restarted. The baseline, measured in the same run, is each service's valid-call latency and memory before
the soak, against after it."""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from zerobubble.tooling.fuzz.targets import RPCS, SERVICES, Deployment, valid_call

LATENCY_CALLS = 10


def _latency_ms(deployment: Deployment, service: str) -> float | None:
    """Median milliseconds of a valid call; None when one failed."""
    times = []
    for _ in range(LATENCY_CALLS):
        started = time.perf_counter()
        if valid_call(deployment, service) is not None:
            return None
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def _snapshot(deployment: Deployment) -> dict[str, dict]:
    return {service: {"valid_call_ms": _latency_ms(deployment, service),
                      "rss_mib": round(deployment.processes[service].rss_bytes() / 2**20, 1)}
            for service in SERVICES}


def bench_fuzz(seconds: float, examples: int, seed: int, workdir: Path | None) -> dict:
    try:
        from zerobubble.tooling.fuzz import abuse
        from zerobubble.tooling.fuzz.campaign import fuzz_rpc
    except ModuleNotFoundError as exc:
        raise SystemExit(f"zerobubble bench fuzz needs the dev extra ({exc.name} is missing): "
                         "pip install -e '.[dev]'") from None

    with tempfile.TemporaryDirectory(prefix="zb-fuzz-") as scratch:
        started = time.monotonic()
        deployment = Deployment(workdir or Path(scratch))
        print(f"services up in {time.monotonic() - started:.1f} s", flush=True)
        try:
            before = _snapshot(deployment)
            sent, findings, restarts = Counter(), [], Counter()
            fuzz_seconds = 0.0
            end = time.monotonic() + seconds
            rounds = 0
            while time.monotonic() < end:
                rng = random.Random(seed + rounds)
                for rpc in RPCS:
                    if time.monotonic() >= end:
                        break
                    report = fuzz_rpc(deployment, rpc, examples=examples, seed=seed + rounds)
                    sent[rpc.name] += report.sent
                    fuzz_seconds += report.seconds
                    findings += report.findings
                    print(f"round {rounds} {rpc.name}: {report.sent} messages in {report.seconds:.1f} s, "
                          f"{len(report.findings)} findings", flush=True)
                    restarts.update(deployment.revive())
                for service in SERVICES:
                    findings += (abuse.junk(deployment, service, rng) + abuse.cut_messages(deployment, service)
                                 + abuse.undecodable_bodies(deployment, service, rng)
                                 + abuse.half_open(deployment, service))
                findings += abuse.cancelled_streams(deployment)
                restarts.update(deployment.revive())
                rounds += 1
            after = _snapshot(deployment)
        finally:
            deployment.close()
    kinds = Counter(f"{finding.rpc} {finding.status}" for finding in findings)
    for finding in {f"{finding.rpc}: {finding.status} {finding.details[:160]!r}": None for finding in findings}:
        print(f"finding: {finding}")
    total = sum(sent.values())
    print(f"{total} messages to {len(sent)} RPCs in {fuzz_seconds:.0f} s of fuzzing ({rounds} rounds): "
          f"{total / fuzz_seconds if fuzz_seconds else 0:.0f} messages/s; {len(findings)} findings; "
          f"restarts {dict(restarts) or 'none'}")
    for service in SERVICES:
        print(f"{service}: valid call {before[service]['valid_call_ms']} ms -> {after[service]['valid_call_ms']} ms, "
              f"memory {before[service]['rss_mib']} MiB -> {after[service]['rss_mib']} MiB")
    return {"seconds": seconds, "rounds": rounds, "messages": total, "messages_per_second":
            round(total / fuzz_seconds, 1) if fuzz_seconds else 0.0, "messages_per_rpc": dict(sent),
            "findings": len(findings), "findings_by_kind": dict(kinds), "restarts": dict(restarts),
            "before": before, "after": after}


def _measure(args) -> dict:
    return bench_fuzz(args.seconds, args.examples, args.seed, args.workdir)


def register_bench(benches) -> None:
    fuzz = benches.add_parser("fuzz", help="soak every RPC of every service with generated messages and wire abuse "
                              "(needs the dev extra)")
    fuzz.add_argument("--seconds", type=float, default=600.0, help="how long to go on")
    fuzz.add_argument("--examples", type=int, default=100, help="messages per RPC per round")
    fuzz.add_argument("--seed", type=int, default=0, help="round r sends the messages of seed + r")
    fuzz.add_argument("--workdir", type=Path, help="where the services keep their files (default: a temp dir)")
    fuzz.set_defaults(measure=_measure)
