"""When the worker evaluates: the starting weights only with at_start, then every `interval` versions."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from stack import tiny_assets

from zerobubble.rollout.config import EvalConfig
from zerobubble.rollout.evaluation import Evaluator
from zerobubble.rollout.metrics import RolloutMetrics


def evaluator(tmp_path, **settings) -> Evaluator:
    _, _, held_out = tiny_assets(tmp_path, train_size=4, eval_size=2)
    config = EvalConfig(datasets={"heldout": held_out}, output_dir=tmp_path / "eval", **settings)
    return Evaluator(config, player=None, reward=None, metrics=RolloutMetrics(CollectorRegistry()),
                     max_new_tokens=4)


def due_versions(schedule: Evaluator, versions: Iterable[int]) -> list[int]:
    due = []
    for version in versions:
        if schedule.due(version):
            schedule.done.add(version)
            due.append(version)
    return due


def test_at_start_evaluates_the_starting_weights_then_every_interval(tmp_path):
    assert due_versions(evaluator(tmp_path, interval=10, at_start=True), range(0, 31)) == [0, 10, 20, 30]


def test_without_at_start_version_0_is_skipped_even_though_it_is_a_multiple(tmp_path):
    # A resumed run's worker starts at version 0 with the base model; the run has its before-training eval.
    assert due_versions(evaluator(tmp_path, interval=10, at_start=False), range(0, 31)) == [10, 20, 30]
    assert due_versions(evaluator(tmp_path / "resumed", interval=1000, at_start=False), [0, 22, 23]) == []
