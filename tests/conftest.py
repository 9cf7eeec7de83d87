"""One MongoDB-wire server for the session; fresh databases for every test.

Set ``ZOMBIE_TEST_MONGO_URL`` to run the suite against a real MongoDB instead of
the SecantusDB server started here.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from pymongo import MongoClient

from zombie_pipeline.embedded import start_server, stop_process
from zombie_pipeline.mongo import client_for
from zombie_pipeline.store import Store

TEST_URL_ENV = "ZOMBIE_TEST_MONGO_URL"


@pytest.fixture(scope="session")
def mongo_url(tmp_path_factory: pytest.TempPathFactory):
    url = os.environ.get(TEST_URL_ENV)
    if url:
        yield url
        return
    base: Path = tmp_path_factory.mktemp("secantus")
    process, info = start_server(base / "data", log_path=base / "server.log", detach=False)
    try:
        yield info.url
    finally:
        stop_process(process)


@pytest.fixture
def client(mongo_url: str) -> MongoClient:
    return client_for(mongo_url)


def _fresh_database(client: MongoClient, prefix: str):
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    return name, client[name]


def _drop_after_test(client: MongoClient, name: str) -> None:
    # The server started here is thrown away with its temporary storage; dropping on it
    # only costs time. A real MongoDB given by URL is cleaned up.
    if os.environ.get(TEST_URL_ENV):
        client.drop_database(name)


@pytest.fixture
def queue_db(client: MongoClient):
    name, database = _fresh_database(client, "test_queue")
    yield database
    _drop_after_test(client, name)


@pytest.fixture
def cache_db(client: MongoClient):
    name, database = _fresh_database(client, "test_cache")
    yield database
    _drop_after_test(client, name)


@pytest.fixture
def store(queue_db, cache_db) -> Store:
    store = Store.of(queue_db, cache_db)
    store.ensure_indexes()
    return store
