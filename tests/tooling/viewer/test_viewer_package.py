"""The page ships in the wheel: `zerobubble view` on an installed package serves every asset its page loads."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile

import pytest
from viewer_helpers import REPO

from zerobubble.tooling.viewer.server import ASSETS

pytestmark = pytest.mark.slow


def test_the_wheel_holds_every_asset_the_page_loads(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(REPO),
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=600, cwd=tmp_path)
    (wheel,) = tmp_path.glob("zerobubble-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {name.rsplit("/", 1)[1] for name in names if name.startswith("zerobubble/tooling/viewer/static/")}
    assert shipped == set(ASSETS)
    page = (REPO / "services" / "tooling" / "viewer" / "static" / "index.html").read_text()
    assert {m for m in re.findall(r'(?:src|href)="/static/([^"]+)"', page)} <= shipped
