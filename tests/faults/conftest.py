"""Every fault scenario runs on a server of its own: stopped, killed and restarted by the test, or left with what
processes killed in the middle of a transaction leave behind, it is nobody else's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import LocalServer, running_server
from zombie_pipeline.config import CACHE_URL_ENV, QUEUE_URL_ENV


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    """SecantusDB on its own port and storage (``--sync-on-commit``): stopped, killed and restarted on both by the test."""
    with running_server(tmp_path / "server") as own:
        yield own


@pytest.fixture
def urls_of(monkeypatch):
    """Points the pipeline's resources (queue and cache) at a URL, for the test."""

    def point_at(url: str) -> None:
        monkeypatch.setenv(QUEUE_URL_ENV, url)
        monkeypatch.setenv(CACHE_URL_ENV, url)

    return point_at
