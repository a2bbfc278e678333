"""The strict docs build fails on each fault that used to let the docs drift, naming it: a repository path that
does not exist, a key missing from a nested section, a repository tree that no longer matches the folders, a block
of commands that neither runs in the tests nor says why. Each test builds a small copy of the site, run through
the real hooks, with one fault in it. (A guide command that no longer works fails tests/docs/test_guide_blocks.py.)"""

from __future__ import annotations

import re
import subprocess

import pytest
from docs_build import MKDOCS, ROOT, build

CLEAN_GUIDE = ("# A guide\n\n```bash\nzerobubble config reward\n```\n\n"
               "<!-- skip: next \"starts a training run\" -->\n```bash\nzerobubble up\n```\n\n"
               "Set `trainer.lora.rank` and `environment.environments[].tool_format`, as `services/common/config.py` "
               "reads them.\n")


def write_site(tmp_path, guide: str = CLEAN_GUIDE, architecture: str | None = None):
    """A small site's mkdocs.yml: a home page, the real architecture page (or the one given) and one guide."""
    docs = tmp_path / "docs"
    (docs / "concepts").mkdir(parents=True)
    (docs / "guides").mkdir()
    (docs / "index.md").write_text("# Home\n\nThe project has five gRPC services.\n")
    (docs / "guides" / "guide.md").write_text(guide)
    real = (ROOT / "docs" / "concepts" / "architecture.md").read_text()
    (docs / "concepts" / "architecture.md").write_text(architecture if architecture is not None else real)
    # The checking hooks of the real site (the reference pages are left out: they take most of a build's time).
    hooks = "".join(f"  - {ROOT / 'docs' / 'hooks' / name}\n" for name in ("checks.py", "tree.py"))
    (tmp_path / "mkdocs.yml").write_text(f"site_name: t\nstrict: true\nhooks:\n{hooks}validation:\n  links:\n"
                                         "    not_found: ignore\n    unrecognized_links: ignore\n")
    return tmp_path / "mkdocs.yml"


def site(tmp_path, guide: str = CLEAN_GUIDE, architecture: str | None = None):
    return build(write_site(tmp_path, guide, architecture), tmp_path / "site")


@pytest.fixture(autouse=True)
def _mkdocs(mkdocs):
    return mkdocs


def test_the_clean_copy_builds(tmp_path):
    done = site(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_wrong_repository_path_fails_the_build(tmp_path):
    done = site(tmp_path, CLEAN_GUIDE + "\nThe launcher is `services/launcher/run.py`.\n")
    assert done.returncode != 0
    assert "guides/guide.md: `services/launcher/run.py` does not exist in the repository" in done.stderr


def test_a_key_missing_from_a_nested_section_fails_the_build(tmp_path):
    # An optional section, a list entry, a named entry, an entry of a service's own config.
    keys = ["trainer.lora.rnk", "environment.environments[].tool_fromat",
            "run.episodes.by_data_source.math.environmnt", "custom_verifiers[].functon"]
    done = site(tmp_path, CLEAN_GUIDE + "".join(f"\nSet `{key}`.\n" for key in keys))
    assert done.returncode != 0
    for key in keys:
        assert f"guides/guide.md: the configuration key `{key}` is in no schema" in done.stderr


def test_a_stale_repository_tree_fails_the_build(tmp_path):
    real = (ROOT / "docs" / "concepts" / "architecture.md").read_text()
    # The tree as it was before services/tooling/: the launcher at the top of services/.
    stale = real.replace("    launcher/   ", "  launcher/     ", 1)
    assert stale != real
    done = site(tmp_path, architecture=stale)
    assert done.returncode != 0
    assert "concepts/architecture.md: the repository tree names `services/launcher/`, which does not exist" \
        in done.stderr
    assert "concepts/architecture.md: the repository tree lacks `services/tooling/launcher/`" in done.stderr


def test_a_wrong_count_of_services_fails_the_build(tmp_path):
    real = (ROOT / "docs" / "concepts" / "architecture.md").read_text()
    done = site(tmp_path, architecture=real + "\nIt is built as four independent gRPC services.\n")
    assert done.returncode != 0
    assert re.search(r'"as four independent gRPC services": the project has \d+ services \(reward, buffer', done.stderr)


def test_a_guide_command_that_neither_runs_nor_says_why_fails_the_build(tmp_path):
    done = site(tmp_path, CLEAN_GUIDE + "\n```\nzerobubble up --set trainer.lora.rank=8\n```\n\n"
                "<!-- skip: next -->\n```bash\nzerobubble up\n```\n")
    assert done.returncode != 0
    assert "guides/guide.md: line 14: a block of commands without its language" in done.stderr
    assert "guides/guide.md: line 19: `skip: next` gives no reason" in done.stderr


def test_make_docs_fails_on_what_the_checks_find(tmp_path):
    # `make docs` runs its own command line, not build() above: it must count the hooks' warnings too (with
    # --quiet, mkdocs leaves them out of strict mode's count and the build passes).
    recipe = (ROOT / "Makefile").read_text().split("\ndocs:", 1)[1].split("\n")[1].strip()
    config = write_site(tmp_path, CLEAN_GUIDE + "\nThe launcher is `services/launcher/run.py`.\n")
    command = recipe.replace("$(VENV)/bin/mkdocs", MKDOCS) + f" -f {config} -d {tmp_path / 'site'}"
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, command
    assert "`services/launcher/run.py` does not exist in the repository" in done.stderr
