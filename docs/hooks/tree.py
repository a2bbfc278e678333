"""The repository tree a page draws, checked against the repository: a tree fenced right after
`<!-- repository-tree -->` may name only paths that exist, and must name every package folder of services/ (two
levels deep). A moved or new folder then fails the strict build, naming it, until the drawing follows."""

from __future__ import annotations

import logging
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- repository-tree -->"
log = logging.getLogger("mkdocs.hooks.tree")
# A tree line: indentation (two spaces a level), a folder (ending in /) or a file, then what it holds.
_ENTRY = re.compile(r"^( *)([\w.-]+(?:/[\w.-]+)*/|[\w-]+\.\w+)(?:\s|$)")
# Lines indented this far continue the description of the entry above.
_DESCRIPTION_COLUMN = 20


def drawn_tree(markdown: str) -> list[str] | None:
    """The paths the marked tree names, from the repository root; None when the page has no marked tree."""
    if MARKER not in markdown:
        return None
    block = re.search(r"```[^\n]*\n(.*?)```", markdown.split(MARKER, 1)[1], flags=re.DOTALL)
    paths, stack = [], []   # stack: (indent, folder) of the folders the next line may sit in
    for line in (block.group(1) if block else "").splitlines():
        entry = _ENTRY.match(line)
        if entry is None or len(entry.group(1)) >= _DESCRIPTION_COLUMN:
            continue
        indent, name = len(entry.group(1)), entry.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "".join(folder for _, folder in stack) + name
        paths.append(path)
        if name.endswith("/"):
            stack.append((indent, name))
    return paths


def package_folders(root: Path) -> list[str]:
    """services/ and every folder of Python modules one and two levels under it."""
    found = ["services/"]
    for depth in ("*", "*/*"):
        for folder in sorted((root / "services").glob(depth)):
            if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py")):
                found.append(folder.relative_to(root).as_posix() + "/")
    return found


def tree_problems(markdown: str, root: Path) -> list[str]:
    drawn = drawn_tree(markdown)
    if drawn is None:
        return []
    problems = [f"the repository tree names `{path}`, which does not exist" for path in drawn
                if not (root / path).exists()]
    problems += [f"the repository tree lacks `{path}`" for path in package_folders(root) if path not in drawn]
    return problems


_NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
# A claim of the whole: "as four independent gRPC services", "all four services" (not "the two services" of a
# sentence about two of them).
_COUNT = re.compile(r"\b(?:as|all|its) (" + "|".join(_NUMBERS) + r")(?: [\w-]+){0,2} services\b", re.IGNORECASE)


def count_problems(text: str, services: tuple[str, ...]) -> list[str]:
    """A count of the project's services that is not the number it has ("as four gRPC services")."""
    return [f"\"{match.group(0)}\": the project has {len(services)} services ({', '.join(services)})"
            for match in _COUNT.finditer(text) if _NUMBERS[match.group(1).lower()] != len(services)]



def _services() -> tuple[str, ...]:
    from zerobubble.tooling.cli import SERVICES

    return SERVICES


def on_config(config):
    for problem in count_problems(config.get("site_description") or "", _services()):
        log.warning("mkdocs.yml site_description: %s", problem)
    return config


def on_page_markdown(markdown, page, config, files):
    prose = re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)
    for problem in tree_problems(markdown, ROOT) + count_problems(prose, _services()):
        log.warning("%s: %s", page.file.src_uri, problem)
    return markdown
