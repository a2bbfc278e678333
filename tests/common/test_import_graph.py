"""The folder tree is the architecture: each service imports `common` (and the generated contracts), never another
service, and `common` imports no service. Benchmarks, the launcher and the demo's tools sit above the services."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "services"
SERVICES = ("buffer", "reward", "rollout", "trainer", "environment", "teacher")
ALLOWED = {**{name: {name, "common", "v1"} for name in SERVICES}, "common": {"common", "v1"}}


def imported_packages(path: Path) -> set[str]:
    """Every `zerobubble.<package>` the module imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found.update(name.split(".")[1] for name in names if name.startswith("zerobubble."))
    return found


def test_services_import_common_and_nothing_of_each_other():
    wrong = {
        f"{path.relative_to(SOURCE)} imports zerobubble.{package}"
        for area, allowed in ALLOWED.items()
        for path in sorted((SOURCE / area).rglob("*.py"))
        for package in imported_packages(path) - allowed
    }
    assert not wrong, sorted(wrong)


def test_the_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from zerobubble.buffer.core import X\n    import zerobubble.reward.app\n")
    assert imported_packages(module) == {"buffer", "reward"}


def test_listing_services_shows_the_four_services_what_they_share_and_the_layer_above():
    listed = {path.name for path in SOURCE.iterdir() if path.name != "__pycache__"}
    assert listed == {*SERVICES, "common", "tooling", "__init__.py", "__main__.py"}

