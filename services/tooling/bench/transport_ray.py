"""The reference design's experience hand-off, measured live for `zerobubble bench transport` (run in the Ray
environment, `make ray-env`, which the bench starts it in).

The reference's producer actor hands each batch, a dict of CPU tensors, to a shared data actor with
`ray.get(data_actor.append_data.remote(batch))`, one batch in flight; its consumer actor polls
`ray.get(data_actor.get_data.remote(uid))`, which deep-copies the batch out of the actor's list, and sleeps when
it gets None. Here are the same three actors, each a process of its own as in the reference, moving batches of
exactly the bytes of the gRPC case (the same response ids, log-probs and prompt ids as tensors). The consumer
polls every millisecond rather than every second, so the reference's own idle waits do not count against it.

    python -m zerobubble.tooling.bench.transport_ray TRAJECTORIES TOKENS COUNT

prints one JSON line: {"items": N, "item_bytes": B, "seconds": S, "ray": VERSION}.
"""

from __future__ import annotations

import copy
import json
import sys
import time

import ray
import torch

POLL_SECONDS = 0.001


def batch(trajectories: int, tokens: int) -> dict[str, torch.Tensor]:
    """The tensors of one experience group of `trajectories` responses of `tokens` tokens."""
    generator = torch.Generator().manual_seed(0)
    return {
        "prompt_ids": torch.arange(256, dtype=torch.int32),
        "response_ids": torch.randint(0, 150_000, (trajectories, tokens), dtype=torch.int32, generator=generator),
        "behaviour_logprobs": -torch.rand((trajectories, tokens), generator=generator),
        "reward": torch.arange(trajectories, dtype=torch.float32) % 2,
        "temperature": torch.ones(trajectories),
    }


def batch_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


@ray.remote(num_cpus=0)
class DataActor:
    """The reference's shared variable actor, its data methods: a list of [uid, data, reads]."""

    def __init__(self, readers: int):
        self.queue: list = []
        self.uid = 0
        self.readers = readers

    def append_data(self, data) -> bool:
        self.queue.append([self.uid, data, 0])
        self.uid += 1
        return True

    def get_data(self, uid: int):
        for i, entry in enumerate(self.queue):
            if entry[0] == uid:
                entry[2] += 1
                data = copy.deepcopy(entry[1])
                if entry[2] == self.readers:
                    self.queue.pop(i)
                return data
        return None


@ray.remote(num_cpus=0)
class Producer:
    def __init__(self, data_actor, trajectories: int, tokens: int):
        self.data_actor = data_actor
        self.batch = batch(trajectories, tokens)

    def loop(self, count: int) -> int:
        for _ in range(count):
            ray.get(self.data_actor.append_data.remote(self.batch))
        return count


@ray.remote(num_cpus=0)
class Consumer:
    def __init__(self, data_actor):
        self.data_actor = data_actor

    def loop(self, count: int) -> int:
        received = 0
        for uid in range(count):
            data = ray.get(self.data_actor.get_data.remote(uid))
            while data is None:
                time.sleep(POLL_SECONDS)
                data = ray.get(self.data_actor.get_data.remote(uid))
            received += batch_bytes(data)
        return received


def main(trajectories: int, tokens: int, count: int) -> dict:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        data_actor = DataActor.remote(readers=1)
        producer = Producer.remote(data_actor, trajectories, tokens)
        consumer = Consumer.remote(data_actor)
        # Every actor's process started and built before the clock starts, as the pusher holds its leases.
        ray.get([producer.loop.remote(0), consumer.loop.remote(0)])
        item_bytes = batch_bytes(batch(trajectories, tokens))
        started = time.perf_counter()
        consumed = consumer.loop.remote(count)
        produced = producer.loop.remote(count)
        received = ray.get(consumed)
        seconds = time.perf_counter() - started
        ray.get(produced)
    finally:
        ray.shutdown()
    if received != count * item_bytes:
        raise RuntimeError(f"the consumer received {received} bytes of {count * item_bytes}")
    return {"items": count, "item_bytes": item_bytes, "seconds": seconds, "ray": ray.__version__}


if __name__ == "__main__":
    print(json.dumps(main(*map(int, sys.argv[1:4]))), flush=True)
