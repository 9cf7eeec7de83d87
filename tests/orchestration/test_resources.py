"""Dagster resources: connections from environment variables, credentials hidden, the policy validated."""

from __future__ import annotations

import datetime as dt
from urllib.parse import quote_plus

import dagster as dg
import pytest

from zombie_pipeline.embedded import free_port
from zombie_pipeline.mongo import DatabaseUnavailable, check_reachable, client_for
from zombie_pipeline.orchestration.resources import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
    CacheDatabase,
    QueueDatabase,
    ZombiePolicyResource,
    resources_from_env,
    store_of,
)
from zombie_pipeline.policy import PolicyError, ZombiePolicy

PASSWORD = "p@ss/w:rd %"
SECRET_URL = f"mongodb://zombie:{quote_plus(PASSWORD)}@db.example.com:27017/admin?authSource=admin"


# --- connections -----------------------------------------------------------------------


def test_queue_and_cache_connect_with_the_url_from_their_environment_variables(monkeypatch, mongo_url, queue_db, cache_db):
    queue = QueueDatabase(database=queue_db.name)
    cache = CacheDatabase(database=cache_db.name)
    # read when used, not when configured
    monkeypatch.setenv(QUEUE_URL_ENV, mongo_url)
    monkeypatch.setenv(CACHE_URL_ENV, mongo_url)

    queue.get_database()[queue.jobs_collection].insert_one({"_id": 1, "at": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)})
    cache.get_database()[cache.cache_collection].insert_one({"_id": 2})

    assert queue_db["jobsBlue"].find_one({"_id": 1})["at"].tzinfo is not None
    assert cache_db["cachedResponsesBlue"].count_documents({"_id": 2}) == 1
    assert queue.get_database().client is client_for(mongo_url)  # the process-wide client, not a new one
    assert queue.url() == mongo_url


def test_a_custom_variable_name_is_honoured(monkeypatch, mongo_url, queue_db):
    monkeypatch.delenv(QUEUE_URL_ENV, raising=False)
    monkeypatch.setenv("OTHER_QUEUE_URL", mongo_url)
    queue = QueueDatabase(url_env_var="OTHER_QUEUE_URL", database=queue_db.name, jobs_collection="jobsGreen")

    store = store_of(queue, CacheDatabase(url_env_var="OTHER_QUEUE_URL", database=queue_db.name))

    assert store.jobs.full_name == f"{queue_db.name}.jobsGreen"
    store.jobs.insert_one({"_id": "x"})
    assert queue_db["jobsGreen"].count_documents({}) == 1


def test_the_url_never_enters_resource_config_and_describe_redacts_it(monkeypatch):
    monkeypatch.setenv(QUEUE_URL_ENV, SECRET_URL)
    queue = QueueDatabase(database="q")

    description = queue.describe()
    config = repr(queue.model_dump() if hasattr(queue, "model_dump") else dict(queue))

    assert description == "mongodb://***:***@db.example.com:27017/admin database=q"
    for shown in (description, config):
        for secret in (PASSWORD, quote_plus(PASSWORD), "zombie:"):
            assert secret not in shown
    assert SECRET_URL not in config


def test_without_a_url_describe_says_embedded(monkeypatch):
    monkeypatch.delenv(CACHE_URL_ENV, raising=False)
    assert CacheDatabase(database="c").describe() == "(embedded default) database=c"
    assert CacheDatabase(database="c").url() is None


def test_an_unreachable_database_fails_fast_without_the_password(monkeypatch):
    url = f"mongodb://zombie:{quote_plus(PASSWORD)}@127.0.0.1:{free_port()}/?directConnection=true"
    monkeypatch.setenv(QUEUE_URL_ENV, url)
    queue = QueueDatabase(database="q", server_selection_timeout_ms=300)

    with pytest.raises(DatabaseUnavailable) as raised:
        check_reachable(queue.get_database(), queue.url())

    for secret in (PASSWORD, quote_plus(PASSWORD)):
        assert secret not in str(raised.value)


def test_the_server_selection_timeout_must_be_positive():
    with pytest.raises(Exception, match="server_selection_timeout_ms"):
        QueueDatabase(database="q", server_selection_timeout_ms=0)


def test_resources_from_env_take_database_names_from_the_environment(monkeypatch):
    monkeypatch.setenv(QUEUE_DATABASE_ENV, "queue_prod")
    monkeypatch.delenv(CACHE_DATABASE_ENV, raising=False)

    resources = resources_from_env()

    assert resources["queue_db"].database == "queue_prod"
    assert resources["cache_db"].database == "datasets_server_cache"
    assert resources["queue_db"].url_env_var == QUEUE_URL_ENV
    assert resources["cache_db"].url_env_var == CACHE_URL_ENV
    assert resources["zombie_policy"].policy() == ZombiePolicy()


def test_an_op_uses_the_resources_inside_a_dagster_run(monkeypatch, mongo_url, queue_db):
    monkeypatch.setenv(QUEUE_URL_ENV, mongo_url)

    @dg.op
    def count_jobs(queue_db: QueueDatabase) -> int:
        database = queue_db.get_database()
        database[queue_db.jobs_collection].insert_one({"status": "waiting"})
        return database[queue_db.jobs_collection].count_documents({})

    @dg.job
    def counting():
        count_jobs()

    result = counting.execute_in_process(resources={"queue_db": QueueDatabase(database=queue_db.name)})

    assert result.success
    assert result.output_for_node("count_jobs") == 1


# --- the policy ------------------------------------------------------------------------------


def test_the_default_policy_is_valid():
    assert ZombiePolicyResource().policy() == ZombiePolicy()


def test_per_type_maximum_durations_can_be_passed_in():
    policy = ZombiePolicyResource(max_duration_seconds_by_type={"/splits": 900}).policy({"/first-rows": 3_600})
    assert policy.max_duration_seconds_by_type == {"/first-rows": 3_600}
    assert policy.max_duration_of("/first-rows") == 3_600
    assert policy.max_duration_of("/splits") == 1_200


@pytest.mark.parametrize(
    "values, field",
    [
        ({"heartbeat_timeout_seconds": -1}, "heartbeat_timeout_seconds"),
        ({"heartbeat_timeout_seconds": 0}, "heartbeat_timeout_seconds"),
        ({"batch_size": 0}, "batch_size"),
        ({"max_duration_seconds": 120}, "max_duration_seconds"),  # T2 below the heartbeat timeout
        ({"max_duration_seconds_by_type": {"/splits": 60}}, "max_duration_seconds_by_type['/splits']"),
        ({"crashed_retry_limit": -1}, "crashed_retry_limit"),
        ({"exceeded_retry_limit": -2}, "exceeded_retry_limit"),
        ({"claim_lease_seconds": -5}, "claim_lease_seconds"),
        ({"max_stale_fraction": 0.0}, "max_stale_fraction"),
        ({"max_stale_fraction": 1.5}, "max_stale_fraction"),
        ({"http_status": 200}, "http_status"),
        ({"cache_generation": "1999-12"}, "cache_generation"),
    ],
)
def test_a_bad_value_is_refused_with_a_message_naming_the_field(values, field):
    with pytest.raises(PolicyError) as raised:
        ZombiePolicyResource(**values).policy()
    assert field in str(raised.value)


def test_every_bad_field_is_named_at_once():
    with pytest.raises(PolicyError) as raised:
        ZombiePolicyResource(heartbeat_timeout_seconds=-1, batch_size=0, crashed_retry_limit=-1).policy()
    message = str(raised.value)
    assert all(name in message for name in ("heartbeat_timeout_seconds", "batch_size", "crashed_retry_limit"))


def test_a_run_with_a_bad_policy_fails_before_any_op_runs():
    ran = []

    @dg.op
    def act(zombie_policy: ZombiePolicyResource) -> None:
        ran.append(True)

    @dg.job
    def acting():
        act()

    result = acting.execute_in_process(
        resources={"zombie_policy": ZombiePolicyResource(batch_size=0)}, raise_on_error=False
    )

    assert not result.success
    assert ran == []
    init_failures = [event for event in result.all_events if event.event_type_value == "RESOURCE_INIT_FAILURE"]
    assert len(init_failures) == 1
    assert "invalid zombie policy: batch_size must be a positive integer" in init_failures[0].event_specific_data.error.message
