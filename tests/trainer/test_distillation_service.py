"""The trainer with a teacher service, on a real buffer: a teacher whose tokenizer names ids otherwise is refused
before the model loads, both tokenizers named; with the tiny model's own tokenizer, steps train on the teacher's
log-probs and report the reverse KL to it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from stack import start_buffer, tiny_assets
from strategy_helpers import make_tiny_model as make_other_model
from test_trainer_service_edges import GENERATIONS, RUN_SPEC, push_groups, start_trainer, wait_for

from zerobubble.common.clients.teacher import TokenizerMismatch
from zerobubble.common.config import load_config
from zerobubble.teacher.app import build as build_teacher
from zerobubble.teacher.config import TeacherServiceConfig
from zerobubble.tooling.tiny.model import make_tiny_model

DISTILL = {**RUN_SPEC, "run_spec.algorithm": "DISTILL"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return tiny_assets(tmp_path_factory.mktemp("tiny"), train_size=6, eval_size=2)


def start_teacher(model):
    return build_teacher(load_config(TeacherServiceConfig, None, {
        "server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5,
        "model.path": str(model)})).start()


def test_a_teacher_of_another_tokenizer_is_refused_before_training_naming_both(assets, tmp_path):
    model, train, _ = assets
    other = make_other_model(tmp_path / "other")
    buffer, teacher = start_buffer(train, tmp_path / "wal", **DISTILL), start_teacher(other)
    try:
        with pytest.raises(TokenizerMismatch) as caught:
            start_trainer(model, buffer.address, tmp_path / "run", **{
                "algorithm.preset": "DISTILL", "teacher.address": teacher.address})
    finally:
        teacher.stop(grace=0)
        buffer.stop(grace=0)
    message = str(caught.value)
    assert message.startswith("teacher: ") and str(model) in message and str(other) in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_routed_teacher_of_another_tokenizer_is_refused_naming_its_route(assets, tmp_path):
    model, train, _ = assets
    other = make_other_model(tmp_path / "other")
    teacher_dir = make_tiny_model(tmp_path / "teacher", size="1m", seed=7)
    buffer = start_buffer(train, tmp_path / "wal", **DISTILL)
    teachers = [start_teacher(teacher_dir), start_teacher(other)]
    try:
        with pytest.raises(TokenizerMismatch) as caught:
            start_trainer(model, buffer.address, tmp_path / "run", **{
                "algorithm.preset": "DISTILL", "teacher.address": teachers[0].address,
                "teachers_by_data_source.apps.address": teachers[1].address})
    finally:
        for teacher in teachers:
            teacher.stop(grace=0)
        buffer.stop(grace=0)
    message = str(caught.value)
    assert message.startswith("teachers_by_data_source.apps: ") and str(other) in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_steps_train_on_the_teachers_log_probs(assets, tmp_path):
    model, train, _ = assets
    teacher_dir = make_tiny_model(tmp_path / "teacher", size="1m", seed=7)
    buffer, teacher = start_buffer(train, tmp_path / "wal", **DISTILL), start_teacher(teacher_dir)
    trainer = None
    try:
        trainer = start_trainer(model, buffer.address, tmp_path / "run", **{
            "algorithm.preset": "DISTILL", "teacher.address": teacher.address, "max_steps": 2})
        push_groups(buffer.address, 4, "worker-0")
        metrics = tmp_path / "run" / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, "two steps")
    finally:
        if trainer is not None:
            trainer.stop(grace=0.5)
        teacher.stop(grace=0)
        buffer.stop(grace=0)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    # The samples' behaviour log-probs are -5 everywhere; the teacher's of random ids under a random model are near
    # -log(vocabulary) = -5.6: a reverse KL of about 0.6 either way, never exactly 0, finite.
    assert all(np.isfinite(row["teacher_reverse_kl"]) and row["teacher_reverse_kl"] != 0 for row in rows)
    assert all(row["samples"] == 2 * GENERATIONS for row in rows)
