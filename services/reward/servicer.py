"""RewardServicer: translates protobuf messages to the RewardScorer core and back. Its handlers are
coroutines: a call waiting for its scores holds no server thread."""

from __future__ import annotations

from contextlib import aclosing

from google.protobuf import json_format

from zerobubble.common.errors import InvalidInput
from zerobubble.common.status import translate_errors
from zerobubble.reward.scorer import RewardScorer, Score, check_batch_size
from zerobubble.reward.verifiers import ScoreItem
from zerobubble.v1 import reward_pb2, reward_pb2_grpc


def to_item(request: reward_pb2.ScoreRequest, where: str = "") -> ScoreItem:
    has_tests = request.HasField("test_cases")
    return ScoreItem(
        id=request.id,
        verifier=request.verifier,
        response=request.response,
        gt_answer=request.gt_answer if request.HasField("gt_answer") else None,
        test_inputs=list(request.test_cases.inputs) if has_tests else None,
        test_outputs=list(request.test_cases.outputs) if has_tests else None,
        partial_credit=request.options.partial_credit,
        prompt=request.prompt,
        metadata=metadata_dict(request, where),
    )


def metadata_dict(request: reward_pb2.ScoreRequest, where: str) -> dict | None:
    if not request.HasField("metadata"):
        return None
    try:
        return json_format.MessageToDict(request.metadata)
    except ValueError as error:  # a Struct may carry NaN or infinity, which JSON (and so the callables) cannot hold
        raise InvalidInput(f"not representable as JSON ({error})", field=f"{where}metadata") from None


def to_result(score: Score) -> reward_pb2.ScoreResult:
    verdict = score.verdict
    return reward_pb2.ScoreResult(
        id=score.id,
        reward=score.reward,
        format_ok=verdict.format_ok,
        answer_ok=verdict.answer_ok,
        extracted_answer=verdict.extracted,
        reason=verdict.reason,
        tests_passed=verdict.tests_passed,
        tests_total=verdict.tests_total,
        seconds=score.seconds,
    )


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, scorer: RewardScorer, stream_window: int):
        self.scorer = scorer
        self.stream_window = stream_window

    @translate_errors
    async def Score(self, request, context):
        return to_result(await self.scorer.score(to_item(request)))

    @translate_errors
    async def ScoreBatch(self, request, context):
        # Before to_item: a message of a million items costs seconds of the event loop to convert.
        check_batch_size(len(request.items), self.scorer.config.limits.max_batch_items)
        scores = await self.scorer.score_batch(
            [to_item(r, f"items[{i}].") for i, r in enumerate(request.items)])
        return reward_pb2.ScoreBatchReply(results=[to_result(s) for s in scores])

    @translate_errors
    async def ScoreStream(self, request_iterator, context):
        items = (to_item(r) async for r in request_iterator)
        # aclosing: a cancelled call closes the core's stream at once, taking its waiting items off the lanes.
        async with aclosing(self.scorer.score_stream(items, window=self.stream_window)) as scores:
            async for score in scores:
                await context.write(to_result(score))

    async def ListVerifiers(self, request, context):
        scorer = self.scorer
        infos = [
            reward_pb2.VerifierInfo(name=v.name, description=v.description, ground_truth=v.ground_truth,
                                    available=True)
            for v in scorer.verifiers.values()
        ]
        infos += [
            reward_pb2.VerifierInfo(name=name, available=False, unavailable_reason=why)
            for name, why in scorer.unavailable.items()
        ]
        rewards = scorer.config.rewards
        return reward_pb2.ListVerifiersReply(
            verifiers=infos, correct_reward=rewards.correct, wrong_reward=rewards.wrong
        )
