"""Every shell and Python block of the guides runs, through Sybil, unless it is marked illustrative with its reason
(`<!-- skip: next "starts a training run" -->`, Sybil's own skip directive; the strict docs build refuses a block
that is neither, docs/hooks/checks.py). A guide's command that no longer works then fails here, naming the page
and the line.

- `bash` blocks run with `bash -e -o pipefail` in an empty folder, this checkout's `zerobubble` first on PATH.
- `console` blocks are sessions: each `$ command` runs the same way, and what it prints (stdout and stderr) must
  match the lines under it, `...` matching anything (doctest's ELLIPSIS), whatever its exit status.
- `python` blocks run in one namespace per guide, in that empty folder.
- `yaml` blocks that are configuration (their top-level keys those of `up`'s run config or of a service's) may
  hold no key their schema lacks, in any nested section or entry: the block is validated with it, and only
  unknown keys count (an example may leave out what a whole config requires).
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
import unittest
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ROOT / "docs" / "guides"
COMMAND_SECONDS = 120
_MATCH = doctest.OutputChecker()
_SHELL_BLOCK = re.compile(r"(?:^|\n)([^\n]*)\n\s*```(?:bash|console)\b")


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=cwd, capture_output=True, text=True,
                          timeout=COMMAND_SECONDS, env={**os.environ, "PATH": path})


def session(text: str) -> list[tuple[str, str]]:
    """A console block's commands (`$ ...`, continued by a trailing backslash) and the output under each."""
    steps: list[tuple[str, str]] = []
    command, output = None, []
    for line in text.splitlines():
        if line.startswith("$ ") and not (command or "").endswith("\\"):
            if command is not None:
                steps.append((command, "\n".join(output)))
            command, output = line[2:], []
        elif command is not None and command.endswith("\\") and not output:
            command += "\n" + line
        elif command is not None:
            output.append(line)
    if command is not None:
        steps.append((command, "\n".join(output)))
    return steps


def unknown_keys(text: str) -> str | None:
    """Why a YAML block that is configuration holds a key no schema it could belong to has, or None."""
    from zerobubble.common.config import describe_errors
    from zerobubble.tooling.launcher.config import UpConfig, _service_schemas

    tree = yaml.safe_load(text)
    if not isinstance(tree, dict):
        return None
    schemas = [UpConfig, *(schema for schema, _ in _service_schemas().values())]
    candidates = [schema for schema in schemas if set(tree) <= set(schema.model_fields)]
    if not candidates:
        known = sorted(key for key in tree if any(key in schema.model_fields for schema in schemas))
        return f"no configuration has all of {sorted(tree)}" if known else None   # not configuration: compose, ...
    found = []
    for schema in candidates:
        try:
            schema.model_validate(tree)
            return None
        except ValidationError as exc:
            unknown = [line.strip() for line in describe_errors(exc, schema) if ": unknown key" in line]
            if not unknown:
                return None
            found.append(f"as {schema.__name__}: " + "; ".join(unknown))
    return "\n".join(found)


def guide_sybil(cwd: Path) -> Sybil:
    def run_bash(example) -> str | None:
        done = shell(example.parsed, cwd)
        if done.returncode != 0:
            return f"exit status {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
        return None

    def run_console(example) -> str | None:
        for command, expected in session(example.parsed):
            done = shell(command, cwd)
            printed = done.stdout + done.stderr
            if not _MATCH.check_output(expected.strip() + "\n", printed,
                                       doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE):
                return f"$ {command}\nexpected:\n{expected}\nprinted (exit {done.returncode}):\n{printed[-3000:]}"
        return None

    return Sybil(parsers=[CodeBlockParser("bash", run_bash), CodeBlockParser("console", run_console),
                          CodeBlockParser("yaml", lambda example: unknown_keys(example.parsed)),
                          PythonCodeBlockParser(), SkipParser()], patterns=["*.md"])


def run_guide(path: Path, cwd: Path) -> tuple[int, list[str]]:
    """How many of the guide's blocks ran, and the reasons given for those that did not."""
    ran, skipped = 0, []
    for example in guide_sybil(cwd).parse(path):
        try:
            example.evaluate()
        except unittest.SkipTest as reason:
            skipped.append(str(reason))
            continue
        if example.region.evaluator is not None and not isinstance(example.parsed, tuple):
            ran += 1
    return ran, skipped


def guides():
    for path in sorted(GUIDES.glob("*.md")):
        # A guide with commands to run starts the command line a few times (seconds each): out of the fast lane.
        runs_commands = any(not previous.lstrip().startswith("<!-- skip:")
                            for previous in _SHELL_BLOCK.findall(path.read_text()))
        yield pytest.param(path, id=path.name, marks=[pytest.mark.slow] if runs_commands else [])


@pytest.mark.parametrize("path", list(guides()))
def test_every_block_of_the_guide_runs_or_says_why_not(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, skipped = run_guide(path, tmp_path)
    assert all(reason.strip() for reason in skipped), f"{path.name}: a block skipped without a reason"


def test_a_broken_command_and_a_wrong_output_fail_naming_the_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    guide = tmp_path / "guide.md"
    guide.write_text("# A guide\n\n```bash\nzerobubble config reward >/dev/null\n```\n\n"
                     "<!-- skip: next \"starts a training run\" -->\n```bash\nzerobubble up\n```\n\n"
                     "```console\n$ zerobubble config nosuchservice\n...invalid choice: 'nosuchservice'...\n```\n\n"
                     "```python\nanswer = 6 * 7\nassert answer == 42\n```\n")
    ran, skipped = run_guide(guide, tmp_path)
    assert (ran, skipped) == (3, ["starts a training run"])

    # A configuration block with a key its schema lacks, in a list entry.
    guide.write_text("# A guide\n\n```yaml\nenvironments:\n  - {name: c, builtin: calculator, tool_fromat: compact}\n"
                     "```\n")
    with pytest.raises(AssertionError, match=r"environments\.0\.tool_fromat: unknown key; did you mean tool_format\?"):
        run_guide(guide, tmp_path)

    guide.write_text("# A guide\n\n\n```bash\nzerobubble confg reward\n```\n")
    with pytest.raises(AssertionError, match=r"(?s)line 4, .*exit status 2.*invalid choice: 'confg'"):
        run_guide(guide, tmp_path)
    guide.write_text("# A guide\n\n```console\n$ zerobubble up --set pipeline.max_new_token=64\n"
                     "...did you mean run.max_new_tokenz?\n```\n")
    with pytest.raises(AssertionError, match=r"did you mean run\.max_new_tokens\?"):
        run_guide(guide, tmp_path)
