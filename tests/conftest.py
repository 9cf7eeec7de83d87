"""One MongoDB-wire server for the session; fresh databases for every test.

Set ``ZOMBIE_TEST_MONGO_URL`` to run the suite against a real MongoDB instead of
the SecantusDB server started here (``tests/servers.py``).
"""

from __future__ import annotations

import os

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from zombie_pipeline.config import STATISTICS_START_ENV

# The statistics tests materialize fixed days of 2024: their partitions must exist, whatever today is.
os.environ.setdefault(STATISTICS_START_ENV, "2024-01-01")

from tests.servers import TEST_URL_ENV, fresh_databases, on_real_mongodb, running_server
from zombie_pipeline.queue.connections import client_for
from zombie_pipeline.queue.store import Store


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject.toml): a worker per core, up to 4, each starting a server of its own.

    None against a real MongoDB: some tests compare the server's own operation counters before and
    after, which another worker's commands would move. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` decides first.
    """
    configured = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if configured:
        return int(configured)
    if on_real_mongodb():
        return 0
    return max(1, min(len(os.sched_getaffinity(0)), 4))


#: The longest modules (a minute and more, most of it waiting on daemons and processes), started first: a worker
#: that takes one of them last would finish long after the other.
LONGEST_FIRST = ("e2e/", "faults/", "test_finish.py", "test_secrets.py", "test_properties.py", "test_simulator.py")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.path.relative_to(config.rootpath / "tests").as_posix()
        return next(
            (index for index, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)), len(LONGEST_FIRST)
        )

    items.sort(key=rank)  # stable: a module's tests keep their order


@pytest.fixture(scope="session")
def mongo_url(tmp_path_factory: pytest.TempPathFactory):
    url = os.environ.get(TEST_URL_ENV)
    if url:
        yield url
        return
    with running_server(tmp_path_factory.mktemp("secantus")) as server:
        yield server.url


@pytest.fixture
def client(mongo_url: str) -> MongoClient:
    return client_for(mongo_url)


@pytest.fixture
def fresh_database(mongo_url: str):
    """Makes databases with names of their own (``fresh_database("queue")``); a real MongoDB drops them afterwards."""
    with fresh_databases(client_for(mongo_url), drop=on_real_mongodb()) as make:
        yield make


@pytest.fixture
def queue_db(fresh_database) -> Database:
    return fresh_database("queue")


@pytest.fixture
def cache_db(fresh_database) -> Database:
    return fresh_database("cache")


@pytest.fixture
def store(queue_db: Database, cache_db: Database) -> Store:
    store = Store.of(queue_db, cache_db)
    store.ensure_indexes()
    return store
