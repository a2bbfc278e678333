import pytest
from docs_build import MKDOCS


@pytest.fixture
def mkdocs():
    if MKDOCS is None:
        pytest.skip("mkdocs is not installed beside this Python (the dev extra brings it: `make install`)")
    return MKDOCS
