"""The documentation site builds strictly, and its own checks catch a renamed file or configuration key."""

from __future__ import annotations

import importlib.util
import shutil

import pytest
from docs_build import ROOT, build


def load_checks():
    spec = importlib.util.spec_from_file_location("docs_checks", ROOT / "docs" / "hooks" / "checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A whole build takes about a minute: `make test` runs these (and `make docs`), the fast lane leaves them out.
@pytest.mark.slow
def test_the_site_builds_strictly_with_its_generated_reference(mkdocs, tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    configuration = (tmp_path / "site" / "reference" / "configuration" / "index.html").read_text()
    # Generated from the schemas: a key of `up` and one of a service are there.
    assert "run_dir" in configuration and "validation.max_version_ahead" in configuration
    # Nested sections and entries too: an optional section, a list entry, a named entry.
    assert "lora.rank" in configuration and "environments[].tool_format" in configuration
    assert "run_spec.episodes.by_data_source.NAME.environment" in configuration
    assert "JoinWeightSync" in (tmp_path / "site" / "reference" / "rpcs" / "index.html").read_text()
    assert "/v1/score" in (tmp_path / "site" / "reference" / "http" / "index.html").read_text()
    assert "zerobubble up" in (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    # The weight-sync page's state table is made from the protocol's own (services/common/sync_protocol.py).
    # The architecture page's table of services is made from the code: the environment service is in it.
    assert "protos/zerobubble/v1/environment.proto" in (tmp_path / "site" / "concepts" / "architecture" /
                                                         "index.html").read_text()
    protocol = (tmp_path / "site" / "concepts" / "weight-sync" / "index.html").read_text()
    assert "awaiting acks" in protocol and "test_sync_protocol.py::" in protocol


def test_a_missing_path_a_second_spelling_and_an_unknown_key_are_found():
    checks = load_checks()
    up, services = checks._schemas()
    found = checks.problems("See `services/trainer/loop.py`, `services/nowhere.py`, `buffer/core.py`, "
                            "`trainer.batch.groups_per_step`, `buffer.run_spec.max_new_tokenz`, "
                            "`validation.max_version_ahead`, `torch.distributed` and `metrics.jsonl`.", up, services)
    assert found == ["`services/nowhere.py` does not exist in the repository",
                     "`buffer/core.py`: write repository paths from the repository root (services/...)",
                     "the configuration key `buffer.run_spec.max_new_tokenz` is in no schema"]


@pytest.mark.slow
def test_a_page_naming_a_removed_key_fails_the_build(mkdocs, tmp_path):
    (tmp_path / "docs" / "hooks").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "hooks" / "checks.py", tmp_path / "docs" / "hooks" / "checks.py")
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSet `pipeline.max_new_token` to 64.\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nhooks:\n  - docs/hooks/checks.py\n"
                                         "exclude_docs: |\n  hooks/\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "index.md: the configuration key `pipeline.max_new_token` is in no schema" in done.stderr
