"""The caller refuses a teacher's answer that is not one finite log-prob per scored token: a teacher whose weights
hold a NaN, and real teachers whose answers are cut, padded or above 0, each named by sequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from teacher_helpers import Altered, start_teacher, student_client
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.common.clients.teacher import BadTeacherAnswer

ASKED = [(np.arange(10, 20, dtype=np.int32), 4), (np.arange(30, 36, dtype=np.int32), 2)]


def refusal(model_dir, scorer=None) -> str:
    host = start_teacher(model_dir, scorer=scorer)
    try:
        with student_client(host.address, model_dir) as client, pytest.raises(BadTeacherAnswer) as caught:
            client.logprobs(ASKED)
        return str(caught.value)
    finally:
        host.stop(grace=0)


def test_a_teacher_whose_weights_hold_a_nan_is_refused(teacher_model, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(teacher_model)
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    model.save_pretrained(tmp_path / "nan")
    AutoTokenizer.from_pretrained(teacher_model).save_pretrained(tmp_path / "nan")
    assert "sequences[0].logprobs" in refusal(tmp_path / "nan") and "not finite" in refusal(tmp_path / "nan")


@pytest.mark.parametrize(("alter", "said"), [
    (lambda out: [out[0][:-1], out[1]], "sequences[0].logprobs: the teacher gave 5 log-probs for 6 scored tokens"),
    (lambda out: [out[0], np.append(out[1], -1.0)], "sequences[1].logprobs: the teacher gave 5 log-probs for 4"),
    (lambda out: [*out, out[1]], "answered 3 sequences for 2 asked"),
    (lambda out: [out[0], out[1] + 10.0], "sequences[1].logprobs: the teacher gave a log-prob above 0"),
])
def test_an_answer_of_the_wrong_length_count_or_sign_is_refused_naming_the_sequence(teacher_model, alter, said):
    assert said in refusal(teacher_model, Altered(teacher_model, alter))


def test_the_unaltered_teacher_passes_the_same_checks(teacher_model):
    host = start_teacher(teacher_model, scorer=Altered(teacher_model, lambda out: out))
    try:
        with student_client(host.address, teacher_model) as client:
            assert [len(a) for a in client.logprobs(ASKED)] == [6, 4]
    finally:
        host.stop(grace=0)
