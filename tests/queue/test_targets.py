"""Where the databases are: each URL waited on for its own bound, whatever the other one is."""

from __future__ import annotations

import time

import pymongo
import pytest

from zombie_pipeline.config import CACHE_URL_ENV, MONGO_TIMEOUT_ENV, QUEUE_URL_ENV
from zombie_pipeline.queue.connections import (
    DEFAULT_TIMEOUT_MS,
    EMBEDDED_TIMEOUT_MS,
    DatabaseUnavailable,
    database_error,
)
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.targets import DatabaseTargets


def closed_url() -> str:
    return f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"


def test_a_queue_given_by_url_beside_the_embedded_cache_is_waited_on_for_a_real_mongodbs_bound(monkeypatch):
    monkeypatch.delenv(MONGO_TIMEOUT_ENV, raising=False)
    url = closed_url()
    targets = DatabaseTargets(queue_url=url)

    assert targets.timeouts() == {url: DEFAULT_TIMEOUT_MS, None: EMBEDDED_TIMEOUT_MS}
    assert targets.queue().client.options.timeout == DEFAULT_TIMEOUT_MS / 1000
    assert targets.wait_ms() == EMBEDDED_TIMEOUT_MS  # the longest a step may wait on either


def test_the_variable_bounds_both_databases_when_set(monkeypatch):
    monkeypatch.setenv(MONGO_TIMEOUT_ENV, "1234")
    url = closed_url()

    assert DatabaseTargets(queue_url=url).timeouts() == {url: 1234, None: 1234}


def test_the_targets_of_the_environment_are_its_urls(monkeypatch):
    url = closed_url()
    monkeypatch.setenv(QUEUE_URL_ENV, url)
    monkeypatch.delenv(CACHE_URL_ENV, raising=False)

    assert DatabaseTargets.from_env().urls() == [url, None]


def test_an_unreachable_queue_given_by_url_fails_within_its_own_bound_not_the_embedded_servers(monkeypatch):
    """With only QUEUE_MONGO_URL set, a command must not wait 30 s for a queue that is not there."""
    monkeypatch.delenv(MONGO_TIMEOUT_ENV, raising=False)
    targets = DatabaseTargets(queue_url=closed_url())

    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match=r"within 5 s"):
        targets.check_reachable(cache=False)

    assert time.monotonic() - started < DEFAULT_TIMEOUT_MS / 1000 + 3


def test_a_database_error_names_the_bound_of_the_url_it_came_from():
    url = "mongodb://db.example.com:27017/"
    error = pymongo.errors.NetworkTimeout("db.example.com:27017: timed out")

    said = str(database_error(error, "status: reading", [url, None], {url: 5000, None: 30000}))

    assert "did not answer within 5 s" in said and "(5000 ms)" in said
