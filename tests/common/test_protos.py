"""The committed stubs must match protos/: regenerate into a temporary folder and compare."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "protos" / "zerobubble" / "v1"
# The stubs' generator: the lowest grpcio-tools the package supports, in an environment of its own (`make protos`).
PROTOC_PYTHON = ROOT / ".venv-protoc" / "bin" / "python"


def test_stubs_are_fresh(tmp_path):
    protos = sorted(STUBS.glob("*.proto"))
    assert {p.stem for p in protos} == {"common", "reward", "buffer", "rollout", "trainer", "environment", "teacher"}
    if not PROTOC_PYTHON.exists():
        pytest.fail(f"{PROTOC_PYTHON} is missing: `make protoc-env` makes it")
    subprocess.run(
        [str(PROTOC_PYTHON), "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", *map(str, protos)],
        check=True,
    )
    fresh = sorted((tmp_path / "zerobubble" / "v1").glob("*_pb2*.py*"))
    assert fresh, "protoc produced nothing"
    stale = [f.name for f in fresh if not (STUBS / f.name).exists()
             or (STUBS / f.name).read_bytes() != f.read_bytes()]
    assert not stale, f"stubs out of date with protos/ (run `make protos`): {stale}"


def test_stubs_import_without_path_tricks():
    code = ("from zerobubble.v1 import reward_pb2_grpc, buffer_pb2_grpc, rollout_pb2_grpc, trainer_pb2_grpc, "
            "environment_pb2_grpc, teacher_pb2_grpc")
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")
