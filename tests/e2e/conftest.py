"""The installed wheel, built once per test session for every test that runs chaoskit as a user installs it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.helpers.installed import User, install


@pytest.fixture(scope="session")
def user(tmp_path_factory: pytest.TempPathFactory) -> Iterator[User]:
    top = tmp_path_factory.mktemp("installed")
    try:
        yield install(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)
