"""RewardClient: score completions from any Python program."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from zerobubble.common.client import ServiceClient
from zerobubble.v1 import common_pb2, reward_pb2, reward_pb2_grpc


def score_request(
    verifier: str,
    response: str,
    gt_answer: str | None = None,
    test_cases: dict | None = None,
    *,
    id: str = "",
    partial_credit: bool = False,
    prompt: str = "",
    metadata: dict | None = None,
) -> reward_pb2.ScoreRequest:
    """Build a request from plain values; test_cases is {"inputs": [...], "outputs": [...]}; metadata is a JSON
    object."""
    request = reward_pb2.ScoreRequest(
        id=id, verifier=verifier, response=response, prompt=prompt,
        options=reward_pb2.ScoreOptions(partial_credit=partial_credit),
    )
    if metadata is not None:
        request.metadata.update(metadata)
    if gt_answer is not None:
        request.gt_answer = gt_answer
    if test_cases is not None:
        request.test_cases.CopyFrom(
            common_pb2.TestCases(inputs=test_cases.get("inputs", []), outputs=test_cases.get("outputs", []))
        )
    return request


class RewardClient(ServiceClient):
    stub_class = reward_pb2_grpc.RewardServiceStub

    def score(self, verifier: str, response: str, gt_answer: str | None = None,
              test_cases: dict | None = None, *, partial_credit: bool = False, prompt: str = "",
              metadata: dict | None = None, timeout: float | None = None) -> reward_pb2.ScoreResult:
        request = score_request(verifier, response, gt_answer, test_cases, partial_credit=partial_credit,
                                prompt=prompt, metadata=metadata)
        return self.unary("Score", request, timeout=timeout)

    def score_batch(self, requests: list[reward_pb2.ScoreRequest], *,
                    timeout: float | None = None) -> list[reward_pb2.ScoreResult]:
        reply = self.unary("ScoreBatch", reward_pb2.ScoreBatchRequest(items=requests), timeout=timeout)
        return list(reply.results)

    def score_stream(self, requests: Iterable[reward_pb2.ScoreRequest], *,
                     timeout: float | None = None) -> Iterator[reward_pb2.ScoreResult]:
        return self.stream("ScoreStream", iter(requests), timeout=timeout)

    def list_verifiers(self, *, timeout: float | None = None) -> reward_pb2.ListVerifiersReply:
        return self.unary("ListVerifiers", reward_pb2.ListVerifiersRequest(), timeout=timeout)
