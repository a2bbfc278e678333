"""The rollout side of `zerobubble bench transport`, in a process of its own as a rollout worker is: lease
prompts, then (once told to on stdin) push one group per prompt on one stream and report the acks.

    python -m zerobubble.tooling.bench.transport_pusher ADDRESS TRAJECTORIES TOKENS COUNT PRODUCER

prints `ready` once it holds its leases, reads one line, pushes, and prints one JSON line:
{"stored": N, "failures": [reason, ...]} (at most a few reasons).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import numpy as np

from zerobubble.common.clients.buffer import BufferClient
from zerobubble.common.codec import encode_array
from zerobubble.common.config import ClientConfig
from zerobubble.v1 import common_pb2

MIB = 1024 * 1024


def template(trajectories: int, tokens: int) -> common_pb2.ExperienceGroup:
    """A group of `trajectories` responses of `tokens` tokens each (int32 ids, float32 log-probs)."""
    rng = np.random.default_rng(0)
    group = common_pb2.ExperienceGroup(prompt_ids=encode_array(np.arange(256, dtype=np.int32)))
    for i in range(trajectories):
        group.trajectories.add(
            response_ids=encode_array(rng.integers(0, 150_000, tokens, dtype=np.int32)),
            behaviour_logprobs=encode_array(-rng.random(tokens, dtype=np.float32)),
            finish_reason=common_pb2.FINISH_REASON_STOP,
            reward=float(i % 2),
            answer_ok=bool(i % 2),
            temperature=1.0,
        )
    return group


def groups(like: common_pb2.ExperienceGroup, prompts: list[common_pb2.Prompt], producer: str) -> Iterator:
    """One group per prompt, shaped like `like`, numbered in order for `producer`."""
    for sequence, prompt in enumerate(prompts):
        group = common_pb2.ExperienceGroup()
        group.CopyFrom(like)
        group.prompt.CopyFrom(prompt)
        group.producer_id = producer
        group.sequence = sequence
        yield group


def client_for(address: str) -> BufferClient:
    return BufferClient(ClientConfig(address=address, max_message_bytes=64 * MIB))


def main(address: str, trajectories: int, tokens: int, count: int, producer: str) -> None:
    like = template(trajectories, tokens)
    with client_for(address) as client:
        prompts = []
        while len(prompts) < count:
            prompts.extend(client.lease(producer, min(1024, count - len(prompts))).prompts)
        print("ready", flush=True)
        sys.stdin.readline()
        stored, failures = 0, []
        for ack in client.push(groups(like, prompts, producer), timeout=600):
            if ack.stored:
                stored += 1
            elif len(failures) < 3:
                failures.append(ack.error or ack.filtered)
    print(json.dumps({"stored": stored, "failures": failures}), flush=True)


if __name__ == "__main__":
    address, trajectories, tokens, count, producer = sys.argv[1:]
    main(address, int(trajectories), int(tokens), int(count), producer)
