"""One table of step figures: metrics.jsonl, Prometheus, the dashboards and the data-parallel combination all
read it, so a figure is added by adding a row."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry

from zerobubble.trainer.algorithms.losses import LossStats
from zerobubble.trainer.figures import BY_NAME, FIGURES, Figure, combine_ranks
from zerobubble.trainer.metrics import TrainerMetrics
from zerobubble.trainer.tracking import step_scalars
from zerobubble.trainer.update import MAX_FIGURES, MEAN_FIGURES, StepFigures


def test_every_loss_statistic_has_its_row():
    # effective_tokens weighs the others (gap_tokens the gap's); every other statistic is a figure, named by the table.
    fields = {field.name for field in dataclasses.fields(LossStats)} - {"effective_tokens", "gap_tokens"}
    assert fields == {figure.loss_stat for figure in FIGURES if figure.loss_stat}
    assert set(MEAN_FIGURES) | set(MAX_FIGURES) == fields


def test_names_are_unique_and_each_consumer_takes_its_rows_from_the_table():
    assert len(BY_NAME) == len(FIGURES)
    registry = CollectorRegistry()
    TrainerMetrics(registry)
    gauges = {metric.name.removeprefix("zerobubble_trainer_") for metric in registry.collect()}
    assert {figure.name for figure in FIGURES if figure.gauge} <= gauges
    assert not {figure.name for figure in FIGURES if not figure.gauge} & gauges
    tags = step_scalars({figure.name: 1.0 for figure in FIGURES})
    assert set(tags) == {f"{figure.dashboard}/{figure.name}" for figure in FIGURES}


def test_micro_batches_combine_each_statistic_as_its_row_says():
    def stats(tokens: float, weight_max: float, clip: float) -> LossStats:
        values = {field.name: None for field in dataclasses.fields(LossStats)}
        return LossStats(**{**values, "clip_fraction": clip, "clip_low_fraction": 0.0, "clip_high_fraction": clip,
                            "ratio_mean": 1.0, "effective_tokens": tokens, "behaviour_weight_max": weight_max})

    step = StepFigures()
    step.add(0.5, stats(10.0, 3.0, 0.1))
    step.add(0.25, stats(30.0, 2.0, 0.5))
    out = step.as_dict()
    assert out["behaviour_weight_max"] == 3.0                      # max
    assert out["clip_fraction"] == (0.1 * 10 + 0.5 * 30) / 40      # token-weighted mean
    assert out["loss"] == 0.75


def test_ranks_combine_each_figure_as_its_row_says(monkeypatch):
    new = Figure("answers_seen", "a figure added to the table", ranks="sum")
    monkeypatch.setitem(BY_NAME, new.name, new)
    ranks = [{"samples": 4.0, "answers_seen": 3.0, "staleness_max": 1.0, "lr": 0.1, "reward_mean": 1.0},
             {"samples": 12.0, "answers_seen": 5.0, "staleness_max": 2.0, "lr": 0.1, "reward_mean": 0.0}]
    assert combine_ranks(ranks) == {"samples": 16.0, "answers_seen": 8.0, "staleness_max": 2.0, "lr": 0.1,
                                    "reward_mean": 0.25}
