"""The teacher under load: requests beyond limits.max_waiting_requests behind a busy model are refused with
RESOURCE_EXHAUSTED naming the setting, the others answered once the model frees; its Prometheus counters say what
it scored and what it refused."""

from __future__ import annotations

import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
from teacher_helpers import Altered, call, start_teacher
from transformers import AutoTokenizer

from zerobubble.common.codec import encode_array
from zerobubble.common.tokenizer_fingerprint import tokenizer_fingerprint
from zerobubble.v1 import teacher_pb2

WAITING = 2


def test_requests_beyond_the_queue_are_refused_and_counted(teacher_model):
    free = threading.Event()
    entered = threading.Semaphore(0)

    def held(out):
        entered.release()
        free.wait(30)
        return out

    host = start_teacher(teacher_model, scorer=Altered(teacher_model, held), **{
        "limits.max_waiting_requests": WAITING, "server.metrics_port": 0})
    fingerprint = tokenizer_fingerprint(AutoTokenizer.from_pretrained(teacher_model))
    request = teacher_pb2.LogprobsRequest(tokenizer_fingerprint=fingerprint, sequences=[
        teacher_pb2.TokenSequence(token_ids=encode_array(np.arange(5, 12, dtype=np.int32)), score_from=3)])

    def outcome():
        try:
            return len(call(host.address, "Logprobs", request, timeout=30).sequences)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()

    try:
        with ThreadPoolExecutor(WAITING + 2) as pool:
            first = pool.submit(outcome)
            assert entered.acquire(timeout=10), "the first request reached the model"
            queued = [pool.submit(outcome) for _ in range(WAITING)]
            # The queue is full once WAITING requests wait behind the one on the model.
            deadline = time.monotonic() + 10
            while host.core.waiting < WAITING + 1:
                assert time.monotonic() < deadline, "the queued requests reached the core"
                time.sleep(0.01)
            refused = outcome()
            free.set()
            answered = [first.result(), *(f.result() for f in queued)]
        assert refused[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.max_waiting_requests" in refused[1]
        assert answered == [1] * (WAITING + 1)
        with urllib.request.urlopen(f"http://127.0.0.1:{host.metrics_port}/metrics", timeout=10) as page:
            metrics = page.read().decode()
    finally:
        free.set()
        host.stop(grace=0)
    assert 'zerobubble_teacher_requests_total{outcome="overloaded"} 1.0' in metrics
    assert f'zerobubble_teacher_requests_total{{outcome="scored"}} {WAITING + 1}.0' in metrics
    assert f"zerobubble_teacher_tokens_scored_total {4.0 * (WAITING + 1)}" in metrics
