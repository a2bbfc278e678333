"""deploy/Dockerfile without a Docker engine: what it copies exists and is sent, what it installs is complete."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(keyword: str) -> list[str]:
    return [line[len(keyword) + 1:].strip() for line in DOCKERFILE.read_text().splitlines()
            if line.startswith(keyword + " ")]


def test_cpu_by_default_cuda_by_build_argument():
    stages = instructions("FROM")
    assert "${PYTHON_IMAGE} AS base-cpu" in stages
    assert "${CUDA_IMAGE} AS base-cuda" in stages
    assert stages[-1] == "base-${BASE}"
    assert "BASE=cpu" in instructions("ARG")
    assert "PYTHON_IMAGE=python:3.11-slim" in instructions("ARG"), "users get the real base by default"
    assert "VLLM=1" in instructions("ARG"), "users get the vLLM engine by default"
    assert any(arg.startswith("CUDA_IMAGE=nvidia/cuda:") for arg in instructions("ARG"))
    assert instructions("ENTRYPOINT") == ['["zerobubble"]']


def test_the_torch_pin_the_image_reads_is_the_project_pin():
    command = re.search(r"TORCH_PIN=\$\((.+?)\)", DOCKERFILE.read_text()).group(1)
    pin = subprocess.run(["sh", "-c", command], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert pin.strip() in (REPO / "constraints.txt").read_text().splitlines()
    assert pin.strip().startswith("torch==")


def test_every_copied_path_exists_and_is_in_the_build_context():
    ignore = (REPO / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "*" in ignore, "the context is an allowlist: everything else stays out"
    for copy in instructions("COPY"):
        for source in copy.split()[:-1]:
            assert (REPO / source).exists(), source
            assert f"!{source}" in ignore, f"{source} is not sent to the build"


def test_a_plain_install_includes_every_package():
    """The image runs `pip install .`, not an editable install: every package must be listed."""
    tool = PYPROJECT["tool"]["setuptools"]
    directories = {v: k for k, v in tool["package-dir"].items()}
    root = directories["services"]
    found = {".".join([root, *p.parent.relative_to(REPO / "services").parts])
             for p in (REPO / "services").rglob("__init__.py") if "__pycache__" not in p.parts}
    packages = tool["packages"]
    assert not isinstance(packages, list) or found <= set(packages), sorted(found - set(packages))
