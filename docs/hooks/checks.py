"""What a strict build checks beyond MkDocs' own links: every repository path written in code (`services/...`,
`tests/...`, ...) exists and is spelled from the repository root, every configuration key written in code
resolves in the schemas, and every code block of a guide says its language, and, when it is a shell or Python
block, either runs in the tests (tests/docs/test_guide_blocks.py) or says why not. A renamed file or key then
breaks the build, naming the page."""

from __future__ import annotations

import logging
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger("mkdocs.hooks.checks")

_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_PATH = re.compile(r"^(services|tests|deploy|protos|docs|\.ci)/[\w./*-]*$")
# Other spellings of a repository path: through the package name, or from inside services/.
_OTHER_SPELLING = re.compile(r"^(zerobubble/|(common|reward|buffer|rollout|trainer|environment|tooling)/)[\w/]+\.py\b")
# A file's name (`environment.yaml`) is not a key, though its stem may be a section's name.
_FILE_NAME = re.compile(r"\.(ya?ml|json|jsonl|py|md|toml|txt|log|sh|proto|parquet|csv)$")
_KEY = re.compile(r"^([a-z_]+(?:\[\])?(?:\.(?:[a-z_0-9]+|NAME)(?:\[\])?)+)(?:[ =:].*)?$")


def _schemas():
    # The schemas `up` checks its service sections against (each service's CONFIG_SCHEMA), read from the config
    # modules: the services' app modules import torch, seconds of every build.
    from zerobubble.tooling.launcher.config import UpConfig, _service_schemas

    return UpConfig, {name: schema for name, (schema, _) in _service_schemas().items()}


def _resolves(schema, parts: list[str]) -> bool:
    """Whether the dotted key names a setting: sections, optional sections and entries are walked into (a list's
    entries written `name[]` or with an index, a dict's with any entry name)."""
    from zerobubble.common.config import nested_model

    node, position = schema, 0
    while position < len(parts):
        name = parts[position].removesuffix("[]")
        fields = getattr(node, "model_fields", None)
        if fields is None or name not in fields:
            return False
        model, nesting = nested_model(fields[name].annotation)
        if model is None:
            # A leaf (or a dict of free-form entries): what follows is data, not a key.
            return True
        position += 1
        if nesting == "dict" or (nesting == "list" and not parts[position - 1].endswith("[]")
                                 and position < len(parts) and parts[position].isdigit()):
            position += 1   # the entry's name or index
        node = model
    return True


def key_problem(key: str, up, services) -> str | None:
    """Why `key` names no setting, or None. Only keys whose first part is a section of some schema are judged:
    module paths and other dotted names pass."""
    parts = key.split(".")
    roots = [up, *services.values()]
    if not any(parts[0].removesuffix("[]") in schema.model_fields for schema in roots):
        return None
    if parts[0] in services and parts[0] in up.model_fields and _resolves(services[parts[0]], parts[1:]):
        return None   # `up`'s service sections take their service's keys
    if any(_resolves(schema, parts) for schema in roots if not (schema is up and parts[0] in services)):
        return None
    return f"the configuration key `{key}` is in no schema"


def path_problem(text: str) -> str | None:
    if _OTHER_SPELLING.match(text):
        return f"`{text}`: write repository paths from the repository root (services/...)"
    if _PATH.match(text):
        path = text.split("::")[0].rstrip("/")
        if not any(ROOT.glob(path)) if "*" in path else not (ROOT / path).exists():
            return f"`{text}` does not exist in the repository"
    return None


def problems(markdown: str, up, services) -> list[str]:
    found = []
    for match in _CODE.finditer(re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)):
        text = match.group(1).strip()
        problem = path_problem(text)
        key = _KEY.match(text)
        if problem is None and key and "/" not in text and not _FILE_NAME.search(text):
            problem = key_problem(key.group(1), up, services)
        if problem:
            found.append(problem)
    return found


# Blocks the guides' test runs (Sybil: tests/docs/test_guide_blocks.py), unless Sybil's own skip directive comes
# right before, with its reason: <!-- skip: next "starts a training run" -->.
RUNNABLE = ("bash", "console", "python")
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})(.*)$")
_SKIP = re.compile(r"^\s*<!--\s*skip:\s*next\b(.*?)-->\s*$")
_REASON = re.compile(r"""^\s*("[^"]+"|'[^']+')\s*$""")
# A block without a language that starts with one of these holds commands: it must say `bash` (or `console`).
_COMMAND = re.compile(r"^\s*(\$ |(zerobubble|python3?|pip|make|docker|docker-compose|kubectl|helm|sbatch|srun|"
                      r"mkdir|cp|curl|git|cd|export|uv)( |$)|\.?venv[\w-]*/bin/)")


def _blocks(markdown: str):
    """(line number, language, first line of the body, the line before the fence) of each fenced block."""
    lines = markdown.splitlines()
    before, number = "", 0
    while number < len(lines):
        opened = _FENCE.match(lines[number])
        if opened is None:
            before = lines[number] if lines[number].strip() else before
            number += 1
            continue
        fence, language = opened.group(1), (opened.group(2).split() or [""])[0].strip("{.}")
        end = number + 1
        while end < len(lines) and not ((closed := _FENCE.match(lines[end])) and closed.group(1).startswith(fence)
                                        and not closed.group(2).strip()):
            end += 1
        body = [line for line in lines[number + 1:end] if line.strip()]
        yield number + 1, language, body[0] if body else "", before
        before, number = "", end + 1


def block_problems(markdown: str) -> list[str]:
    """A guide's shell and Python blocks say their language and run in the tests, or are marked illustrative with
    a reason."""
    found = []
    for number, language, first, before in _blocks(markdown):
        skip = _SKIP.match(before)
        if not language and _COMMAND.match(first):
            found.append(f"line {number}: a block of commands without its language: write ```bash (or ```console "
                         f"for a session with its output), so that the tests run it or it says why not")
        elif language in ("sh", "shell", "shell-session"):
            found.append(f"line {number}: write `bash` (or `console` for a session with its output), not `{language}`")
        elif skip and not _REASON.match(skip.group(1)):
            found.append(f"line {number}: `skip: next` gives no reason in quotes, e.g. "
                         f"<!-- skip: next \"starts a training run\" -->")
        elif skip and language not in RUNNABLE:
            found.append(f"line {number}: a `{language or 'plain'}` block never runs; `skip: next` is for bash, "
                         f"console and python")
    return found


def on_page_markdown(markdown, page, config, files):
    up, services = _schemas()
    if page.file.src_uri.startswith("guides/"):
        for problem in block_problems(markdown):
            log.warning("%s: %s", page.file.src_uri, problem)
    for problem in problems(markdown, up, services):
        log.warning("%s: %s", page.file.src_uri, problem)
    return markdown
