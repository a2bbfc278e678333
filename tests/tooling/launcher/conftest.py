"""The launcher's tests run where a user's commands have been: in a folder holding what `make demo` leaves (a
finished run in runs/demo, the tiny model's cache in runs/.assets). A test that falls back on the default run
folder, or any path relative to where it runs, meets that state here as it would on the user's machine, instead of
passing on a clean clone only; and none of them may change it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from zerobubble.tooling.configs import DEMO

# What `make demo` leaves, relative to the checkout: a finished run and the assets' cache beside it.
DEMO_RUN = Path("runs/demo")
LEFT_BY_THE_DEMO = {
    DEMO_RUN / "configs" / "up.yaml": yaml.safe_dump(yaml.safe_load(DEMO.read_text())),
    DEMO_RUN / "logs" / "trainer.log": "step 950 done\n",
    DEMO_RUN / "trainer" / "metrics.jsonl": '{"step": 1, "loss": 0.1}\n',
    DEMO_RUN / "eval" / "summary.jsonl": '{"version": 0, "pass@1": 0.2}\n',
    DEMO_RUN / "summary.json": '{"run_dir": "runs/demo", "eval_before": 0.2}\n',
    Path("runs/.assets/tiny-model/config.json"): "{}\n",
}


def user_state(root: Path) -> dict[Path, bytes]:
    return {path.relative_to(root): path.read_bytes() for path in sorted((root / "runs").rglob("*")) if path.is_file()}


@pytest.fixture(autouse=True)
def after_the_demo(tmp_path_factory, monkeypatch) -> Path:
    """Each test runs in a checkout the demo has run in; afterwards that run is as the demo left it."""
    checkout = tmp_path_factory.mktemp("checkout")
    for path, text in LEFT_BY_THE_DEMO.items():
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text(text)
    before = user_state(checkout)
    monkeypatch.chdir(checkout)
    yield checkout
    assert user_state(checkout) == before, "a test changed the run or the cache the demo left in runs/"
