"""`zerobubble view` in headless Chromium (Debian's package) against the run folder of a short real `zerobubble up`:
each view's DOM holds its elements, its screenshot shows them (the colours the page draws them in), and the
browser's console stays empty. A multi-turn group (a loss mask and per-token versions on a real sample's tokens)
shows its observation tokens apart and its turn boundaries."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from viewer_helpers import NEEDS_CHROMIUM, chromium, page_requests, viewer

from zerobubble.tooling.configs import DEMO as DEMO_CONFIG

pytestmark = [NEEDS_CHROMIUM, pytest.mark.slow]

STEPS, GENERATIONS, EVAL_PROMPTS, MAX_NEW_TOKENS = 4, 4, 4, 8
SHORT_RUN = {
    "tiny_model.warm_start_steps": 0, "task.train_size": 32, "task.eval_size": EVAL_PROMPTS,
    "buffer.prompts.epochs": 1, "run.num_generations": GENERATIONS, "run.max_new_tokens": MAX_NEW_TOKENS,
    "trainer.batch.groups_per_step": 4, "trainer.batch.micro_batch_samples": 16,
    "rollout.generation.prompts_per_batch": 4, "rollout.eval.interval": 2, "rollout.eval.samples_per_prompt": 2,
    "trainer.max_steps": STEPS, "trainer.tracking.rollout_log.interval_steps": 1,
}
# What the page draws with (viewer.css and viewer.js): the curves' first colour, a wrong sample's red border, the
# grey of observation tokens and the purple line of a turn boundary.
CURVE_BLUE, WRONG_RED, OBSERVATION_GREY, TURN_PURPLE = (9, 105, 218), (207, 34, 46), (234, 238, 242), (216, 185, 255)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """The run folder of a short demo, as `zerobubble up` leaves it."""
    root = tmp_path_factory.mktemp("viewed")
    run_dir = root / "run"
    command = [sys.executable, "-m", "zerobubble", "up", "--config", str(DEMO_CONFIG), f"--set=run_dir={run_dir}",
               *(f"--set={key}={value}" for key, value in SHORT_RUN.items())]
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    process = subprocess.Popen(command, cwd=root, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, output[-4000:]
    return run_dir


@pytest.fixture(scope="module")
def base(run_dir):
    with viewer(run_dir) as url:
        yield url


def rollout_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trainer" / "rollouts.jsonl").read_text().splitlines()]


def view(url: str, shots: Path, name: str) -> tuple[str, Image.Image]:
    """The page at `url`: its DOM and its screenshot, after checking the console stayed empty for both loads."""
    dom, console = chromium(url)
    assert 'data-state="ready"' in dom, dom[-2000:]
    assert 'id="view-error"' not in dom, re.findall(r'id="view-error">([^<]*)', dom)
    shot = shots / f"{name}.png"
    _, console_shot = chromium(url, screenshot=shot)
    assert console == [] and console_shot == [], console + console_shot
    return dom, Image.open(shot).convert("RGB")


def has_colour(image: Image.Image, colour: tuple[int, int, int], at_least: int = 20) -> bool:
    counts = {rgb: n for n, rgb in image.getcolors(image.width * image.height)}
    return counts.get(colour, 0) >= at_least


def test_the_curves_show_the_steps_the_pipeline_figures_and_the_evaluations(base, run_dir, tmp_path):
    dom, shot = view(f"{base}/#curves", tmp_path, "curves")
    for title in ("reward", "accuracy", "staleness (policy versions)", "trainer idle fraction",
                  "weight sync seconds", "heldout: pass@k"):
        assert f'data-title="{title}"' in dom, title
    reward = re.search(r'<polyline points="([^"]*)"[^>]*data-key="reward_mean"', dom)
    assert reward and len(reward.group(1).split()) == STEPS
    evaluated = re.search(r'<polyline points="([^"]*)"[^>]*data-key="pass@1"', dom)
    evaluations = (run_dir / "eval" / "summary.jsonl").read_text().splitlines()
    assert evaluated and len(evaluated.group(1).split()) == len(evaluations) >= 2
    assert f"step {STEPS} · policy version {STEPS}" in dom
    assert has_colour(shot, CURVE_BLUE, 200)


def test_the_rollout_log_lists_its_groups_and_filters_them(base, run_dir, tmp_path):
    rows = rollout_rows(run_dir)
    dom, shot = view(f"{base}/#rollouts", tmp_path, "rollouts")
    assert len(re.findall(r'class="group-row"', dom)) == len(rows) > 0
    # Each response's reward as a dot of its colour: 10 x 10 pixels apiece on the screenshot.
    dots = re.findall(r'class="dot" title="[^"]*" style="background: rgb\((\d+), (\d+), (\d+)\)', dom)
    assert len(dots) == sum(len(row["responses"]) for row in rows)
    for colour in set(dots):
        assert has_colour(shot, tuple(map(int, colour)), 100 * dots.count(colour) * 3 // 4)
    assert f"of {len(rows)} logged" in dom
    later = [n for n, row in enumerate(rows) if row["step"] >= 3]
    dom, _ = view(f"{base}/#rollouts?step_min=3", tmp_path, "later")
    assert [int(n) for n in re.findall(r'class="group-row" data-line="(\d+)"', dom)] == later


def test_a_group_shows_its_samples_and_a_sample_its_tokens_coloured_by_log_prob(base, run_dir, tmp_path):
    row = rollout_rows(run_dir)[0]
    dom, shot = view(f"{base}/#group/0/1", tmp_path, "group")
    assert len(re.findall(r'class="sample-card', dom)) == GENERATIONS
    tokens = re.findall(r'<span class="tok tok-model" title="id (\d+) · log-prob (-?[\d.]+)', dom)
    response = row["responses"][1]
    assert [int(i) for i, _ in tokens] == response["token_ids"] and len(tokens) == response["length"]
    assert [float(lp) for _, lp in tokens] == pytest.approx(response["logprobs"], abs=1e-4)
    assert "turn-boundary" not in dom and "tok-obs" not in dom
    assert has_colour(shot, WRONG_RED, 50) or all(r["answer_ok"] for r in row["responses"])
    # Each token's background is its probability's colour: all distinct from the page's own.
    token_colours = set(re.findall(r'data-i="\d+" style="background: (rgb\([^)]*\))', dom))
    assert token_colours and any(has_colour(shot, tuple(map(int, c[4:-1].split(", "))), 30) for c in token_colours)


def test_a_multi_turn_sample_shows_observation_tokens_apart_and_its_turns(run_dir, tmp_path):
    episode_run = tmp_path / "episode-run"
    shutil.copytree(run_dir / "trainer", episode_run / "trainer", ignore=shutil.ignore_patterns("checkpoints"))
    row = rollout_rows(run_dir)[0]
    response = row["responses"][0]
    length = len(response["token_ids"])
    # The model's tokens, then an observation, then the model again with the next policy version.
    third = length // 3
    response["loss_mask"] = [1] * third + [0] * third + [1] * (length - 2 * third)
    response["token_versions"] = [0] * (2 * third) + [1] * (length - 2 * third)
    response["episode"] = {"environment": "calculator", "turns": 2, "tool_calls": 1, "step_rewards": [0.0, 1.0],
                           "ended_reason": "done"}
    with open(episode_run / "trainer" / "rollouts.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")
    line = len(rollout_rows(episode_run)) - 1
    with viewer(episode_run) as url:
        dom, shot = view(f"{url}/#group/{line}/0/version", tmp_path, "episode")
    # Turns numbered as the episode's card counts them: two model turns, the tool's answer between.
    boundaries = re.findall(r'class="turn-boundary" data-turn="(\d+)">([a-z0-9 :/]+)<', dom)
    assert boundaries == [("1", "turn 1: model"), ("1", "observation / tool"), ("2", "turn 2: model")]
    assert "episode in calculator: 2 turns · 1 tool calls · ended: done" in dom
    assert len(re.findall(r'class="tok tok-obs"', dom)) == third
    assert len(re.findall(r'class="tok tok-model"', dom)) == length - third
    assert '<option value="version" selected=""' in dom or re.search(r"policy versions 0 \(blue\) to 1", dom)
    versions = re.findall(r'version (\d+)[^"]*" data-i="\d+" style="background: (rgb\([^)]*\))', dom)
    assert len({colour for _, colour in versions}) == 2
    assert has_colour(shot, OBSERVATION_GREY, 30) and has_colour(shot, TURN_PURPLE, 30)


def test_the_evaluation_answers_at_two_versions_side_by_side(base, run_dir, tmp_path):
    dom, shot = view(f"{base}/#evals/heldout/0/{STEPS}", tmp_path, "evals")
    questions = re.findall(r'class="eval-question" data-prompt="([^"]+)"', dom)
    assert len(questions) == EVAL_PROMPTS
    assert dom.count("version 0: ") == EVAL_PROMPTS and dom.count(f"version {STEPS}: ") == EVAL_PROMPTS
    answers = (run_dir / "eval" / "heldout" / "version-000000.jsonl").read_text().splitlines()
    assert len(re.findall(r'class="answer', dom)) == 2 * len(answers)
    # Each question's own text and ground truth stand above its answers.
    first = json.loads(answers[0])
    assert f'<pre class="question">{html.escape(first["question"], quote=False)}</pre>' in dom
    assert f"ground truth: {first['gt_answer']}" in dom
    assert has_colour(shot, WRONG_RED, 20) or has_colour(shot, (45, 164, 78), 20)


def test_the_page_loads_nothing_from_outside_the_package(base, tmp_path):
    """Each view in the real browser: every request the page makes goes to the viewer itself (an asset or script
    from elsewhere would be a request to another origin, or, blocked by the page's content-security policy, a
    console error), and the page did load its assets and its data."""
    requested = set()
    for name, route in (("curves", ""), ("rollouts", "#rollouts"), ("group", "#group/0"),
                        ("evals", f"#evals/heldout/0/{STEPS}")):
        log = tmp_path / f"{name}.json"
        dom, console = chromium(f"{base}/{route}", net_log=log)
        assert 'data-state="ready"' in dom and console == [], (name, console)
        requests = page_requests(log)
        assert requests and {initiator for initiator, _ in requests} == {base}, (name, requests)
        elsewhere = [url for _, url in requests if not url.startswith(base + "/")]
        assert not elsewhere, (name, elsewhere)
        requested |= {url.removeprefix(base).split("?")[0] for _, url in requests}
    assert {"/static/viewer.js", "/static/viewer.css", "/api/metrics", "/api/rollouts", "/api/group",
            "/api/eval-pair"} <= requested, requested
