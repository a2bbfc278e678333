"""`zerobubble bench reward`, HTTP against gRPC: math items/s through POST /v1/score and through the Score RPC of
one `zerobubble serve reward` process, one item per call, with 1 and with 64 clients calling at once.

Both sides are asyncio clients in this process (grpc.aio on one channel, aiohttp on one keep-alive session,
the HTTP client OpenRLHF and slime use), so the figures compare the transports and the service, not the
client libraries' threads. The service runs in its own process, as in use.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import grpc

from zerobubble.tooling.bench.reward import _MATH
from zerobubble.tooling.ports import free_port
from zerobubble.v1 import reward_pb2, reward_pb2_grpc

CLIENTS = (1, 64)
_DEADLINE_SECONDS = 300.0


def _items(count: int) -> list[dict]:
    return [{"id": str(i), "verifier": "boxed", "response": f"Step {i}: so \\boxed{{{pred}}}", "gt_answer": gold}
            for i, (gold, pred) in ((i, _MATH[i % len(_MATH)]) for i in range(count))]


async def _drive(call: Callable[[dict], Awaitable[None]], items: list[dict], clients: int) -> float:
    """Items per second with `clients` callers taking items from one list until it is empty."""
    queue = list(reversed(items))

    async def client() -> None:
        while queue:
            await call(queue.pop())

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return len(items) / (time.perf_counter() - start)


async def _rates(grpc_address: str, http_url: str, items: int) -> dict[str, float]:
    figures = {}
    async with grpc.aio.insecure_channel(grpc_address) as channel, aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=_DEADLINE_SECONDS),
            connector=aiohttp.TCPConnector(limit=max(CLIENTS))) as session:
        stub = reward_pb2_grpc.RewardServiceStub(channel)

        async def over_grpc(item: dict) -> None:
            await stub.Score(reward_pb2.ScoreRequest(**item), timeout=_DEADLINE_SECONDS)

        async def over_http(item: dict) -> None:
            async with session.post(f"{http_url}/v1/score", json=item) as reply:
                reply.raise_for_status()
                await reply.read()

        for name, call in (("grpc", over_grpc), ("http", over_http)):
            await _drive(call, _items(len(_MATH)), len(_MATH))
            for clients in CLIENTS:
                figures[f"{name}_items_per_s_{clients}_clients"] = round(await _drive(call, _items(items), clients), 1)
    return figures


def bench_http_vs_grpc(items: int = 400) -> dict:
    http_port = free_port()
    command = [sys.executable, "-m", "zerobubble", "serve", "reward", "--listen", "127.0.0.1:0",
               "--set", "server.metrics_port=null", "--set", f"http.listen=127.0.0.1:{http_port}",
               "--set", "sandbox.slots=1", "--set", f"limits.max_pending_items={max(items, 8192)}"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready = json.loads(server.stdout.readline() or "null")
        if ready is None:
            raise RuntimeError("zerobubble serve reward did not start (run it alone to see why)")
        figures = asyncio.run(_rates(ready["address"], f"http://127.0.0.1:{http_port}", items))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    for clients in CLIENTS:
        figures[f"http_vs_grpc_{clients}_clients"] = round(
            figures[f"http_items_per_s_{clients}_clients"] / figures[f"grpc_items_per_s_{clients}_clients"], 3)
    return figures
