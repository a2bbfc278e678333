"""The tinker-cookbook's own loops against a Tinker front on the tiny model: the front in a process of this
environment (it needs the project's torch), each loop in the cookbook's (.venv-cookbook), over HTTP.

Runs from `make test-cookbook` (ZEROBUBBLE_COOKBOOK names the cookbook's environment); plain pytest skips it, so
the main suites do not run the loops a second time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from zerobubble.tooling.tinker.cookbook_runner import running_front
from zerobubble.tooling.tiny.model import make_tiny_model
from zerobubble.tooling.tiny.task import make_arithmetic_task, read_task, target_response

TOKEN = "tml-zerobubble-cookbook-test"


@pytest.fixture(scope="session")
def cookbook_python() -> Path:
    venv = os.environ.get("ZEROBUBBLE_COOKBOOK")
    if not venv:
        pytest.skip("the cookbook's loops run from `make test-cookbook` (ZEROBUBBLE_COOKBOOK=.venv-cookbook)")
    python = Path(venv).resolve() / "bin" / "python"
    assert python.exists(), f"no cookbook environment at {venv} (make cookbook-env)"
    return python


@pytest.fixture(scope="session")
def task(tmp_path_factory) -> dict[str, Path]:
    """The demo's kind of task, small: sums of three digits, and its train rows as conversations (the
    supervised loop's local JSONL file: question, then the boxed answer)."""
    folder = tmp_path_factory.mktemp("task")
    train, held_out = make_arithmetic_task(folder, train_size=400, eval_size=20, operations="+", operands=3)
    conversations = folder / "conversations.jsonl"
    with conversations.open("w") as out:
        for row in read_task(train):
            reply = {"role": "assistant", "content": target_response(row.gt_answer)}
            out.write(json.dumps({"messages": [*row.messages, reply]}) + "\n")
    return {"train": train, "eval": held_out, "conversations": conversations}


@pytest.fixture(scope="session")
def front(cookbook_python, tmp_path_factory):
    folder = tmp_path_factory.mktemp("front")
    model_dir = make_tiny_model(folder / "model", size="1m", seed=0)
    # One torch thread: the front shares the cores with the loop's client.
    with running_front(model_dir, folder, TOKEN, poll_wait_s=5.0, torch_threads=1) as running:
        yield running
