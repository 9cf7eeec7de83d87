"""Dagster resources: connections from environment variables, credentials hidden, the policy validated."""

from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import sys
from typing import Any
from urllib.parse import quote_plus

import dagster as dg
import pytest

from tests.helpers import databases_from_env, found, raw, report_suggesting
from tests.test_policy import BAD_POLICIES, case_id
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    MONGO_TIMEOUT_ENV,
    POLICY_FILE_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
    SettingError,
)
from zombie_pipeline.defs.resources import Databases, PolicyRefused, ZombiePolicyResource, resources_from_env
from zombie_pipeline.messages import shown
from zombie_pipeline.policy import InvalidPolicy, PolicyError, PolicySettings, ZombiePolicy
from zombie_pipeline.queue.connections import (
    DEFAULT_TIMEOUT_MS,
    EMBEDDED_TIMEOUT_MS,
    DatabaseUnavailable,
    client_for,
)
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.secrets import redact_url
from zombie_pipeline.statistics.suggestion_log import save_suggestions

PASSWORD = "p@ss/w:rd %"
SECRET_URL = f"mongodb://zombie:{quote_plus(PASSWORD)}@db.example.com:27017/admin?authSource=admin"


# --- the databases ---------------------------------------------------------------------


def test_the_databases_connect_with_the_urls_their_environment_variables_hold(
    monkeypatch, mongo_url, queue_db, cache_db
):
    monkeypatch.setenv(QUEUE_URL_ENV, mongo_url)
    monkeypatch.setenv(CACHE_URL_ENV, mongo_url)
    databases = databases_from_env(queue_db.name, cache_db.name)

    store = databases.store()
    raw(store.jobs).insert_one({"_id": 1, "at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)})
    raw(store.cache).insert_one({"_id": 2})

    assert queue_db["jobsBlue"].find_one({"_id": 1})["at"].tzinfo is not None
    assert cache_db["cachedResponsesBlue"].count_documents({"_id": 2}) == 1
    assert store.jobs.database.client is client_for(mongo_url)  # the process-wide client, not a new one
    assert databases.urls() == [mongo_url, mongo_url]


def test_the_wait_is_bounded_by_the_config_else_the_variable_else_a_default_for_where_the_database_is(monkeypatch):
    monkeypatch.delenv(MONGO_TIMEOUT_ENV, raising=False)
    assert Databases().wait_ms() == EMBEDDED_TIMEOUT_MS  # the embedded server shares the machine's CPU
    assert Databases(queue_url=SECRET_URL, cache_url=SECRET_URL).wait_ms() == DEFAULT_TIMEOUT_MS
    monkeypatch.setenv(MONGO_TIMEOUT_ENV, "1234")
    assert Databases(queue_url=SECRET_URL, cache_url=SECRET_URL).wait_ms() == 1234
    assert Databases().wait_ms() == 1234  # set, it bounds the embedded server too
    assert Databases(timeout_ms=700).wait_ms() == 700


def test_collections_a_deployment_named_otherwise_are_taken_as_configured(mongo_url, queue_db):
    databases = Databases(
        queue_url=mongo_url, cache_url=mongo_url, queue_database=queue_db.name, jobs_collection="jobsGreen"
    )

    store = databases.store()

    assert store.jobs.full_name == f"{queue_db.name}.jobsGreen"
    raw(store.jobs).insert_one({"_id": "x"})
    assert queue_db["jobsGreen"].count_documents({}) == 1


def test_the_url_is_config_only_as_the_name_of_its_variable_and_describe_redacts_it(monkeypatch):
    monkeypatch.setenv(QUEUE_URL_ENV, SECRET_URL)
    monkeypatch.delenv(CACHE_URL_ENV, raising=False)
    databases = resources_from_env()["databases"]

    description = repr(databases.describe())
    config = repr(databases.model_dump())

    assert databases.describe() == {
        "queue": "mongodb://***:***@db.example.com:27017/admin database=datasets_server_queue",
        "cache": "(embedded default) database=datasets_server_cache",
    }
    assert databases.cache_url is None  # unset: the embedded server
    assert QUEUE_URL_ENV in config  # an EnvVar: the UI shows its name
    for text in (description, config):
        for secret in (PASSWORD, quote_plus(PASSWORD), "zombie:"):
            assert secret not in text


def test_a_configured_url_keeps_the_drivers_retryable_writes():
    """A real MongoDB applies a write pymongo retries after a reset once (the embedded server does not: test_embedded)."""
    url = f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"
    assert Databases(queue_url=url, cache_url=url).queue().client.options.retry_writes is True


def test_an_unreachable_database_fails_fast_naming_its_variable_without_the_password():
    url = f"mongodb://zombie:{quote_plus(PASSWORD)}@127.0.0.1:{free_port()}/?directConnection=true"

    with pytest.raises(DatabaseUnavailable) as raised:
        Databases(queue_url=url, cache_url=url, timeout_ms=300).check_reachable()

    assert f"(from ${QUEUE_URL_ENV})" in str(raised.value)
    for secret in (PASSWORD, quote_plus(PASSWORD)):
        assert secret not in str(raised.value)


@pytest.mark.parametrize("timeout", [0, -1])
def test_a_non_positive_timeout_is_refused_naming_the_field(timeout: int):
    """Checked where a database is taken (in a step: a refusal, not a resource that fails the run's start)."""
    with pytest.raises(SettingError, match=f"timeout_ms={timeout} "):
        Databases(timeout_ms=timeout).queue()


def test_resources_from_env_take_database_names_from_the_environment(monkeypatch):
    monkeypatch.setenv(QUEUE_DATABASE_ENV, "queue_prod")
    monkeypatch.delenv(CACHE_DATABASE_ENV, raising=False)

    resources = resources_from_env()

    assert resources["databases"].queue_database == "queue_prod"
    assert resources["databases"].cache_database == "datasets_server_cache"
    assert resources["zombie_policy"].policy() == ZombiePolicy()


def test_the_locations_policy_comes_from_its_policy_file_read_when_it_loads(monkeypatch, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("heartbeat_timeout_seconds: 600\nmax_duration_seconds_by_type:\n  /splits: 2400\n")
    monkeypatch.setenv(POLICY_FILE_ENV, str(path))

    resource = resources_from_env()["zombie_policy"]

    assert resource.policy() == ZombiePolicy(
        heartbeat_timeout_seconds=600, max_duration_seconds_by_type={"/splits": 2400}
    )
    path.write_text("heartbeat_timeout_seconds: 5\n")  # read once, when the location loads
    assert resource.policy().heartbeat_timeout_seconds == 600


def test_a_bad_policy_file_fails_the_locations_load_with_a_line_per_refusal_from_one_frame(monkeypatch, tmp_path):
    """Refused before any run can write anything: Dagster shows the location's load error, the lines that
    ``zombie-pipeline policy check`` prints, raised where the location is defined (Dagster hides its own frames)."""
    path = tmp_path / "policy.yaml"
    path.write_text("max_stale_fraction: 7\nheartbeat_timout_seconds: 600\n")
    env = {**os.environ, POLICY_FILE_ENV: str(path)}

    loaded = subprocess.run(
        [sys.executable, "-c", "import zombie_pipeline.definitions"], env=env, capture_output=True, text=True
    )

    assert loaded.returncode != 0
    said = loaded.stderr[loaded.stderr.index("InvalidPolicy: ") :].splitlines()
    assert said[:2] == [
        f"InvalidPolicy: invalid zombie policy: {path}: max_stale_fraction=7: should be less than or equal to 1",
        f"invalid zombie policy: {path}: heartbeat_timout_seconds is not a policy field (did you mean "
        "heartbeat_timeout_seconds?)",
    ]
    user_frames = [line for line in loaded.stderr.splitlines() if "zombie_pipeline" in line and "File " in line]
    assert len(user_frames) == 1 and "definitions.py" in user_frames[0]


def test_a_launchpad_run_overrides_one_setting_of_the_locations_policy_and_keeps_the_others(monkeypatch, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("heartbeat_timeout_seconds: 600\nhttp_status: 503\n")
    monkeypatch.setenv(POLICY_FILE_ENV, str(path))
    seen = []

    @dg.op
    def read_policy(zombie_policy: ZombiePolicyResource) -> None:
        seen.append(zombie_policy.policy())

    @dg.job
    def reading():
        read_policy()

    resources = {"zombie_policy": resources_from_env()["zombie_policy"]}
    run_config = {"resources": {"zombie_policy": {"config": {"http_status": 502}}}}
    assert reading.execute_in_process(resources=resources, run_config=run_config).success

    assert (seen[0].heartbeat_timeout_seconds, seen[0].http_status) == (600, 502)


def test_a_step_gets_its_store_checked_from_the_resource(monkeypatch, mongo_url, queue_db, cache_db):
    monkeypatch.setenv(QUEUE_URL_ENV, mongo_url)
    monkeypatch.setenv(CACHE_URL_ENV, mongo_url)

    @dg.op
    def count_jobs(context, databases: Databases) -> int:
        with databases.store_for(context, "count_jobs: counting jobs") as store:
            store.jobs.insert_one({"status": "waiting"})
            return store.jobs.count_documents({})

    @dg.job
    def counting():
        count_jobs()

    result = counting.execute_in_process(resources={"databases": databases_from_env(queue_db.name, cache_db.name)})

    assert result.success
    assert result.output_for_node("count_jobs") == 1


def test_a_database_error_in_the_middle_of_a_step_fails_it_in_one_line_naming_the_url_the_step_and_the_setting(
    mongo_url, queue_db, cache_db
):
    """The step reaches its databases, then a command fails (here the server refuses a duplicate): its failure is one
    line and the facts as metadata, never pymongo's traceback, and carries no password."""

    @dg.op
    def insert_twice(context, databases: Databases) -> None:
        with databases.store_for(context, "insert_twice: inserting a job twice") as store:
            raw(store.jobs).insert_one({"_id": "twice"})
            raw(store.jobs).insert_one({"_id": "twice"})

    @dg.job
    def inserting():
        insert_twice()

    databases = Databases(queue_url=mongo_url, cache_url=mongo_url, queue_database=queue_db.name, timeout_ms=400)
    result = inserting.execute_in_process(resources={"databases": databases}, raise_on_error=False)

    assert not result.success
    [failure] = [event for event in result.all_events if event.is_step_failure]
    message = found(failure.step_failure_data.error).message.strip()
    line = message.removeprefix("dagster._core.definitions.events.Failure: ")
    assert "\n" not in line and "Traceback" not in message
    assert line.startswith("insert_twice: inserting a job twice: MongoDB at ")
    assert "refused a command (DuplicateKeyError" in line
    assert "$ZOMBIE_MONGO_TIMEOUT_MS bounds every wait on the database (400 ms)" in line
    metadata = {key: value.value for key, value in found(failure.step_failure_data.user_failure_data).metadata.items()}
    assert (
        metadata["doing"] == "insert_twice: inserting a job twice" and metadata["variable"] == "ZOMBIE_MONGO_TIMEOUT_MS"
    )


# --- the policy ------------------------------------------------------------------------------


def test_the_default_policy_is_valid():
    assert ZombiePolicyResource().policy() == ZombiePolicy()


VALUE_CASES = [case for case in BAD_POLICIES if "no_such_setting" not in case[0]]


@pytest.mark.parametrize("values, named, across_fields", VALUE_CASES, ids=[case_id(case) for case in VALUE_CASES])
def test_the_resource_refuses_a_bad_value_in_one_line_naming_it_and_never_to_be_retried(values, named, across_fields):
    """Dagster checks a config's types before launch, not its bounds: the values are checked where the policy is
    taken, first thing in a step, which fails then in one line (a run retry would be refused the same way)."""
    resource = ZombiePolicyResource(**values)  # built as Dagster builds it from a run's config

    with pytest.raises(PolicyRefused) as refused:
        resource.policy()

    failure = refused.value
    assert isinstance(failure, dg.Failure) and isinstance(failure, InvalidPolicy)
    assert failure.allow_retries is False
    assert failure.description == str(failure) and "\n" not in failure.description
    assert failure.description.startswith("invalid zombie policy: ")
    for name in named:
        assert name in failure.description, failure.description
    for field, value in values.items():  # each field, and for a bound it broke, with the value it was given
        assert field in failure.description, failure.description
        if not across_fields:
            assert f"{field}={shown(value)}" in failure.description, failure.description  # as typed


def test_a_name_that_is_no_policy_field_is_refused_when_the_resource_is_built():
    """As Dagster's config schema refuses it in the Launchpad, before launch."""
    with pytest.raises(PolicyError, match="no_such_setting"):
        ZombiePolicyResource(no_such_setting=1)  # type: ignore[call-arg]  # no such field, on purpose


def test_the_resource_has_the_policys_fields_types_defaults_and_descriptions():
    policy_fields = PolicySettings.model_fields
    resource_fields = {name: info for name, info in ZombiePolicyResource.model_fields.items() if name in policy_fields}

    assert set(resource_fields) == set(policy_fields)
    for name, info in policy_fields.items():
        assert resource_fields[name].annotation == info.annotation, name
        assert resource_fields[name].description == info.description, name
        assert resource_fields[name].get_default(call_default_factory=True) == info.get_default(
            call_default_factory=True
        ), name


def test_the_policy_in_force_takes_the_suggestions_only_when_it_opts_in(store):
    save_suggestions(store.suggestions, report_suggesting({"/splits": 1_500}))
    configured: dict[str, Any] = {"max_duration_seconds_by_type": {"/splits": 900, "/first-rows": 1_800}}

    assert ZombiePolicyResource(**configured).in_force(store) == ZombiePolicy(**configured)
    in_force = ZombiePolicyResource(**configured, use_suggested_max_durations=True).in_force(store)
    assert in_force.max_duration_seconds_by_type == {"/splits": 1_500, "/first-rows": 1_800}


def test_a_database_out_of_reach_is_said_in_a_line_of_its_own_at_each_attempt_and_fails_with_its_facts():
    """Dagster's retry event shows the cause under its own frames: the step's log says it first, in one line."""
    url = f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"
    shown = redact_url(url)

    @dg.op(retry_policy=dg.RetryPolicy(max_retries=1))
    def counting(context, databases: Databases) -> None:
        with databases.store_for(context, "counting: counting jobs") as store:
            store.jobs.count_documents({})

    @dg.job
    def count() -> None:
        counting()

    with dg.DagsterInstance.ephemeral() as instance:
        result = count.execute_in_process(
            resources={"databases": Databases(queue_url=url, cache_url=url, timeout_ms=300)},
            instance=instance,
            raise_on_error=False,
        )
        logged = [(record.level, record.user_message) for record in instance.all_logs(result.run_id)]

    warned = [message for level, message in logged if level == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith(f"cannot reach MongoDB at {shown} (from $QUEUE_MONGO_URL)")
    assert warned[0].endswith("(attempt 1 of 2: the step is tried again)") and "\n" not in warned[0]
    [failure] = [event for event in result.all_events if event.is_step_failure]
    data = found(failure.step_failure_data.user_failure_data)
    assert found(data.description).startswith(f"cannot reach MongoDB at {shown}")
    assert {key: value.value for key, value in data.metadata.items()} == {
        "url": shown,
        "database": "datasets_server_queue",
        "timeout_ms": 300,
        "variable": QUEUE_URL_ENV,
    }
