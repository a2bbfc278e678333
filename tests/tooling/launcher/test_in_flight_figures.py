"""The in-flight bench's figures over repeats: means with their spread, and each mode beside between_batches
repeat by repeat."""

from __future__ import annotations

import argparse

import pytest

from zerobubble.tooling.bench.in_flight import register_bench, summary, versus


def run(mode: str, pass_at_1: float, samples_per_s: float, staleness: float, dropped: int) -> dict:
    return {"weight_updates": mode, "max_staleness": 2, "samples_per_s": samples_per_s,
            "trainer_idle_fraction": 0.25, "staleness_mean": 1.0, "staleness_token_mean": staleness,
            "stale_dropped": dropped, "held_out_pass@1": pass_at_1, "learning_per_minute": pass_at_1 / 4,
            "training_seconds": 240.0, "steps": 30}


def test_summary_gives_the_mean_and_the_spread_of_each_figure():
    figures = summary([run("in_flight", 0.3, 6.0, 0.5, 0), run("in_flight", 0.1, 4.0, 0.3, 2)])

    assert figures["repeats"] == 2 and figures["weight_updates"] == "in_flight"
    assert figures["held_out_pass@1"] == 0.2 and figures["held_out_pass@1_spread"] == [0.1, 0.3]
    assert figures["samples_per_s"] == 5.0 and figures["samples_per_s_spread"] == [4.0, 6.0]
    assert figures["staleness_token_mean"] == 0.4 and figures["stale_dropped"] == 1.0


def test_one_repeat_has_no_spread():
    figures = summary([run("in_flight", 0.3, 6.0, 0.5, 0)])

    assert figures["held_out_pass@1"] == 0.3 and "held_out_pass@1_spread" not in figures


def test_versus_pairs_the_repeats_and_divides_the_means():
    mine = [run("in_flight", 0.3, 6.0, 0.4, 0), run("in_flight", 0.2, 6.0, 0.4, 0)]
    base = [run("between_batches", 0.2, 4.0, 1.0, 1), run("between_batches", 0.25, 4.0, 1.0, 3)]

    figures = versus(mine, base)

    assert figures["samples_per_s"] == 1.5 and figures["staleness_token_mean"] == 0.4
    assert figures["learning_per_minute"] == round(0.25 / 0.225, 3)
    assert figures["stale_dropped"] == [0.0, 2.0]
    assert figures["held_out_pass@1_difference"] == [0.1, -0.05]


def test_versus_has_no_ratio_over_a_baseline_that_learnt_nothing():
    figures = versus([run("in_flight", 0.1, 6.0, 0.4, 0)], [run("between_batches", 0.0, 4.0, 1.0, 0)])

    assert figures["learning_per_minute"] is None


@pytest.mark.parametrize("option", ["--train-seconds=0", "--repeats=0", "--workers=0", "--modes=in_flight,sideways",
                                    "--engine=sglang"])
def test_bad_options_are_refused_naming_them(option, capsys):
    parser = argparse.ArgumentParser()
    register_bench(parser.add_subparsers(dest="what"))

    with pytest.raises(SystemExit):
        parser.parse_args(["in-flight", option])

    assert option.split("=")[0] in capsys.readouterr().err
