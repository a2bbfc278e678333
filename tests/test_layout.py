"""tests/ mirrors services/: each service, and each part of the tooling, has its tests in the folder of its name."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Folders of data rather than code, tested where they are read.
TESTED_ELSEWHERE = {"tooling/configs": "the shipped configs are loaded by tests/common/test_config.py"}


def _packages(root: Path) -> list[str]:
    top = [p for p in sorted(root.iterdir()) if any(p.glob("*.py"))]
    tooling = [p for p in sorted((root / "tooling").iterdir()) if any(p.glob("*.py"))]
    return [str(p.relative_to(root)) for p in top + tooling]


def test_every_service_and_tooling_part_has_a_test_folder_of_its_name():
    packages = _packages(REPO / "services")
    assert {"buffer", "environment", "rollout", "tooling", "tooling/launcher", "tooling/viewer"} <= set(packages)
    missing = [name for name in packages if name not in TESTED_ELSEWHERE
               and not any((REPO / "tests" / name).glob("test_*.py"))]
    assert not missing, f"services/ folders without tests/ of the same name: {missing}"


def test_no_test_folder_names_a_part_services_does_not_have():
    lanes = {"compose", "deploy", "docs", "e2e", "packaging", "peers", "tooling"}
    for folder in sorted((REPO / "tests").iterdir()):
        if folder.is_dir() and folder.name != "__pycache__" and folder.name not in lanes:
            assert (REPO / "services" / folder.name).is_dir(), f"tests/{folder.name} mirrors no services/ folder"
    for folder in sorted((REPO / "tests" / "tooling").iterdir()):
        if folder.is_dir() and folder.name != "__pycache__":
            assert (REPO / "services" / "tooling" / folder.name).is_dir(), \
                f"tests/tooling/{folder.name} mirrors no services/tooling/ folder"


def test_no_two_test_modules_share_a_name():
    # Test folders are not packages: pytest imports each module by its bare name, so a second one of the same name
    # stops the whole run at collection.
    seen: dict[str, Path] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        assert path.name not in seen, f"{path.relative_to(REPO)} and {seen[path.name].relative_to(REPO)}: rename one"
        seen[path.name] = path
