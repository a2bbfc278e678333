"""The teacher service on a real socket over the tiny model: its log-probs are the model's own, checked by hand; bad
input gets INVALID_ARGUMENT or RESOURCE_EXHAUSTED naming the field; calls without the bearer token are refused; a
student whose tokenizer names ids otherwise is refused, both tokenizers named."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch
from teacher_helpers import TOKEN, call, other_tokenizer, start_teacher, student_client
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.common.clients.teacher import TokenizerMismatch
from zerobubble.common.codec import encode_array
from zerobubble.common.tokenizer_fingerprint import tokenizer_fingerprint
from zerobubble.v1 import common_pb2, teacher_pb2

MAX_SEQUENCES, MAX_TOKENS, MAX_LENGTH = 4, 64, 32


@pytest.fixture(scope="module")
def teacher(teacher_model):
    host = start_teacher(teacher_model, **{"limits.max_sequences": MAX_SEQUENCES,
                                           "limits.max_tokens_per_request": MAX_TOKENS,
                                           "limits.max_sequence_tokens": MAX_LENGTH})
    yield host
    host.stop(grace=0)


@pytest.fixture(scope="module")
def fingerprint(teacher_model):
    return tokenizer_fingerprint(AutoTokenizer.from_pretrained(teacher_model))


def sequence(ids, score_from: int, dtype=np.int32) -> teacher_pb2.TokenSequence:
    return teacher_pb2.TokenSequence(token_ids=encode_array(np.asarray(ids, dtype=dtype)), score_from=score_from)


def test_log_probs_are_the_models_own_log_softmax_of_the_same_ids(teacher, teacher_model):
    # (prompt, response): the response's tokens are scored, each given everything before it.
    pairs = [("<|im_start|>user\n2+3=?<|im_end|>\n<|im_start|>assistant\n", "5<|im_end|>"), ("7+1+1=", "9"),
             ("a", "b")]
    tokenizer = AutoTokenizer.from_pretrained(teacher_model)
    asked = [(np.array(tokenizer(prompt + response)["input_ids"], dtype=np.int32), len(tokenizer(prompt)["input_ids"]))
             for prompt, response in pairs]
    with student_client(teacher.address, teacher_model) as client:
        answers = client.logprobs(asked)
    model = AutoModelForCausalLM.from_pretrained(teacher_model).eval()
    for (ids, start), answer in zip(asked, answers, strict=True):
        # By hand: one sequence alone, no padding; position t - 1's log-softmax read at token t.
        with torch.no_grad():
            logits = model(torch.tensor(ids, dtype=torch.long)[None]).logits[0].double()
        expected = [float(torch.log_softmax(logits[t - 1], -1)[ids[t]]) for t in range(start, len(ids))]
        assert answer.tolist() == pytest.approx(expected, abs=1e-5)
    assert [len(a) for a in answers] == [len(ids) - start for ids, start in asked]


def test_a_batch_split_over_requests_and_forward_passes_answers_as_one(teacher_model):
    rng = np.random.default_rng(0)
    asked = [(rng.integers(0, 256, int(n), dtype=np.int32), 1 + i % 3) for i, n in
             enumerate(rng.integers(4, 20, 7))]
    host = start_teacher(teacher_model)
    small = start_teacher(teacher_model, **{"limits.batch_tokens": 16, "limits.max_sequences": 2,
                                            "limits.max_tokens_per_request": 40})
    try:
        with student_client(host.address, teacher_model) as whole, student_client(small.address, teacher_model) as cut:
            expected, got = whole.logprobs(asked), cut.logprobs(asked)
    finally:
        host.stop(grace=0)
        small.stop(grace=0)
    for one, other in zip(expected, got, strict=True):
        np.testing.assert_allclose(other, one, atol=1e-5)


@pytest.mark.parametrize(("sequences", "code", "field"), [
    ([], grpc.StatusCode.INVALID_ARGUMENT, "sequences: at least one"),
    ([sequence([1, 2], 1)] * (MAX_SEQUENCES + 1), grpc.StatusCode.RESOURCE_EXHAUSTED, "limits.max_sequences"),
    ([sequence(range(20), 1)] * 4, grpc.StatusCode.RESOURCE_EXHAUSTED, "limits.max_tokens_per_request"),
    ([sequence(range(MAX_LENGTH + 1), 1)], grpc.StatusCode.RESOURCE_EXHAUSTED, "sequences[0].token_ids"),
    ([sequence([1, 2, 3], 1), sequence([1, 2, 3], 0)], grpc.StatusCode.INVALID_ARGUMENT, "sequences[1].score_from"),
    ([sequence([1, 2, 3], 3)], grpc.StatusCode.INVALID_ARGUMENT, "sequences[0].score_from"),
    ([sequence([1, 2], 1), sequence([1, 100000], 1)], grpc.StatusCode.INVALID_ARGUMENT, "sequences[1].token_ids"),
    ([sequence([1, -2], 1)], grpc.StatusCode.INVALID_ARGUMENT, "sequences[0].token_ids"),
    ([sequence([1.0, 2.0], 1, dtype=np.float32)], grpc.StatusCode.INVALID_ARGUMENT, "sequences[0].token_ids.dtype"),
    ([teacher_pb2.TokenSequence(token_ids=common_pb2.Array(dtype=common_pb2.DTYPE_INT32, shape=[3], data=b"\0" * 8),
                                score_from=1)], grpc.StatusCode.INVALID_ARGUMENT, "sequences[0].token_ids.data"),
])
def test_bad_requests_get_their_status_naming_the_field(teacher, fingerprint, sequences, code, field):
    request = teacher_pb2.LogprobsRequest(sequences=sequences, tokenizer_fingerprint=fingerprint)
    with pytest.raises(grpc.RpcError) as caught:
        call(teacher.address, "Logprobs", request)
    assert caught.value.code() == code
    assert field in caught.value.details()


def test_a_request_without_the_tokenizer_fingerprint_is_refused_naming_it(teacher):
    with pytest.raises(grpc.RpcError) as caught:
        call(teacher.address, "Logprobs", teacher_pb2.LogprobsRequest(sequences=[sequence([1, 2], 1)]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tokenizer_fingerprint" in caught.value.details()


def test_bytes_that_are_no_request_are_invalid_argument(teacher):
    with grpc.insecure_channel(teacher.address) as channel:
        raw = channel.unary_unary("/zerobubble.v1.TeacherService/Logprobs")
        with pytest.raises(grpc.RpcError) as caught:
            raw(b"\xff\xff\xff", timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request" in caught.value.details()


@pytest.mark.parametrize("token", [None, "wrong"])
def test_calls_without_the_bearer_token_are_unauthenticated(teacher, fingerprint, token):
    for method, request in [("Connect", teacher_pb2.ConnectRequest(tokenizer_fingerprint=fingerprint)),
                            ("Logprobs", teacher_pb2.LogprobsRequest(sequences=[sequence([1, 2], 1)],
                                                                     tokenizer_fingerprint=fingerprint))]:
        with pytest.raises(grpc.RpcError) as caught:
            call(teacher.address, method, request, token=token)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_student_whose_tokenizer_names_ids_otherwise_is_refused_naming_both(teacher, teacher_model, tmp_path):
    student = other_tokenizer(tmp_path / "student")
    with student_client(teacher.address, student) as client, pytest.raises(TokenizerMismatch) as caught:
        client.connect()
    message = str(caught.value)
    assert str(student) in message and str(teacher_model) in message
    # The same refusal for a request that skipped Connect: the ids would be scored as other tokens.
    other = tokenizer_fingerprint(AutoTokenizer.from_pretrained(student))
    with pytest.raises(grpc.RpcError) as raw:
        call(teacher.address, "Logprobs", teacher_pb2.LogprobsRequest(sequences=[sequence([1, 2], 1)],
                                                                      tokenizer_fingerprint=other))
    assert raw.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert str(teacher_model) in raw.value.details() and "tokenizer_fingerprint" in raw.value.details()


def test_connect_describes_the_teacher_and_its_limits(teacher, teacher_model, fingerprint):
    with student_client(teacher.address, teacher_model) as client:
        reply = client.connect()
    assert reply.tokenizer_fingerprint == fingerprint
    assert (reply.max_sequences, reply.max_tokens_per_request, reply.max_sequence_tokens) == (
        MAX_SEQUENCES, MAX_TOKENS, MAX_LENGTH)
    assert reply.vocab_size == len(AutoTokenizer.from_pretrained(teacher_model))
