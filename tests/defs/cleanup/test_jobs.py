"""kill_zombies_job through Dagster: the ops, their metadata, dry run, brake, partitions, suggestions opted in."""

import hashlib
from typing import Any

import dagster as dg
import pytest

from tests.helpers import (
    ago,
    database_resources,
    databases_from_env,
    found,
    job_document,
    report_suggesting,
    run_kill_zombies,
    step_failure_messages,
    step_metadata,
    workload,
)
from zombie_pipeline.config import CACHE_URL_ENV, POLICY_FILE_ENV, QUEUE_URL_ENV
from zombie_pipeline.defs.resources import ZombiePolicyResource, resources_from_env
from zombie_pipeline.defs.tags import POLICY_OVERRIDES_TAG, POLICY_SHA256_TAG, POLICY_SOURCE_TAG
from zombie_pipeline.queue.audit_documents import Event, EventState
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.secrets import redact_url
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.statistics.suggestion_log import save_suggestions

WORKLOAD = workload(finished=150, crashed=8, never_heartbeated=3, overdue=3, running=20, waiting=5, seed=11)
URL_ENV = "ZOMBIE_TEST_JOBS_URL"


@pytest.fixture
def resources(store, mongo_url, monkeypatch):
    monkeypatch.setenv(URL_ENV, mongo_url)
    return {**database_resources(store, URL_ENV), "zombie_policy": ZombiePolicyResource()}


def test_the_job_finalizes_the_zombies_and_reports_them_in_its_metadata(store, resources):
    simulation = simulate(store, WORKLOAD)
    result = run_kill_zombies(resources)
    assert result.success
    summary = step_metadata(result, "report_cleanup")
    assert summary["finalized"] == 14
    assert summary["reason/missing_heartbeat"] == 8
    assert summary["reason/never_heartbeated"] == 3
    assert summary["reason/exceeded_max_duration"] == 3
    assert summary["lost_to_live_worker"] == 0
    assert summary["cache_written"] == 14
    assert len(summary["finalized_jobs"].records) == 14
    assert "finalized 14 zombies" in summary["summary"]
    assert step_metadata(result, "plan_and_recover")["policy"]["heartbeat_timeout_seconds"] == 300
    assert store.jobs.count_documents({ID: {"$in": simulation.zombie_ids}, Job.STATUS: Status.ERROR}) == 14


def test_a_run_records_its_policy_file_and_the_fields_its_config_overrode_as_tags_and_in_its_summary(
    store, resources, monkeypatch, tmp_path
):
    path = tmp_path / "policy.yaml"
    path.write_text("heartbeat_timeout_seconds: 600\nhttp_status: 503\n")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    monkeypatch.setenv(POLICY_FILE_ENV, str(path))
    simulate(store, WORKLOAD)
    overridden = {"resources": {"zombie_policy": {"config": {"http_status": 502, "heartbeat_timeout_seconds": 600}}}}

    with dg.DagsterInstance.ephemeral() as instance:
        result = run_kill_zombies(
            {**resources, "zombie_policy": resources_from_env()["zombie_policy"]},
            instance=instance,
            run_config=overridden,
        )
        tags = found(instance.get_run_by_id(result.run_id)).tags

    assert result.success
    # the run page shows its tags: the file, what it held when the run read it, and the one field set otherwise
    assert (tags[POLICY_SOURCE_TAG], tags[POLICY_SHA256_TAG], tags[POLICY_OVERRIDES_TAG]) == (
        f"file:{path}",
        digest,
        "http_status",
    )
    said = f"policy: file {path} (sha256 {digest}), run config overrides http_status"
    assert said in step_metadata(result, "report_cleanup")["summary"]
    assert step_metadata(result, "plan_and_recover")["policy_source"] == said.removeprefix("policy: ")


def test_a_run_without_a_policy_file_records_the_default_policy(store, resources, monkeypatch):
    monkeypatch.delenv(POLICY_FILE_ENV, raising=False)
    simulate(store, WORKLOAD)

    with dg.DagsterInstance.ephemeral() as instance:
        result = run_kill_zombies(resources, instance=instance)
        tags = found(instance.get_run_by_id(result.run_id)).tags

    assert tags[POLICY_SOURCE_TAG] == "default"
    assert POLICY_SHA256_TAG not in tags and POLICY_OVERRIDES_TAG not in tags
    assert step_metadata(result, "report_cleanup")["summary"].split("\n")[0].endswith("; policy: default")


def test_a_dry_run_shows_the_evidence_table_and_writes_nothing(store, resources):
    simulate(store, WORKLOAD)
    jobs_before = list(store.jobs.find())
    result = run_kill_zombies(resources, dry_run=True)
    assert result.success
    evidence = step_metadata(result, "find_zombies")["evidence"]
    assert len(evidence.records) == 14
    assert {"job_id", "type", "reason", "age_seconds", "last_heartbeat", "threshold_seconds"} <= set(
        evidence.records[0].data
    )
    assert list(store.jobs.find()) == jobs_before
    assert store.events.count_documents({}) == 0


def test_the_brake_fails_the_run_with_its_reason_and_the_override_proceeds(store, resources):
    now = utc_now()
    store.jobs.insert_many(
        [job_document(dataset=f"u/dead-{i}", started_at=now.replace(year=now.year - 1)) for i in range(25)]
    )
    braked = run_kill_zombies(resources)
    assert not braked.success
    [message] = step_failure_messages(braked)
    assert "brake engaged: 25 of 25" in message
    [failure] = failures(braked)
    assert (
        failure.description.startswith("brake engaged: 25 of 25 started jobs (100%) look dead")
        and "\n" not in failure.description
    )
    assert {name: value.value for name, value in failure.metadata.items()} == {
        "stale": 25,
        "started": 25,
        "stale_fraction": 1.0,
        "max_stale_fraction": 0.5,
        "min_started_for_brake": 20,
    }
    assert store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 25

    assert run_kill_zombies(resources, override_brake=True).success
    assert store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 0


def test_a_partitioned_run_cleans_only_its_job_type(store, resources):
    old = utc_now().replace(year=2020)
    store.jobs.insert_many(
        [job_document("/first-rows", f"u/a{i}", started_at=old) for i in range(3)]
        + [job_document("/splits", f"u/b{i}", started_at=old) for i in range(3)]
        + [job_document("/splits", f"u/live{i}", started_at=utc_now(), last_heartbeat=utc_now()) for i in range(20)]
    )
    result = run_kill_zombies(resources, partition_key="/first-rows")
    assert result.success
    finalized_types = {event[Event.JOB][Job.TYPE] for event in store.events.find({Event.STATE: EventState.DONE})}
    assert finalized_types == {"/first-rows"}
    assert store.jobs.count_documents({Job.TYPE: "/splits", Job.STATUS: Status.STARTED}) == 23


def test_an_opted_in_run_applies_the_latest_suggestions_and_says_so(store, resources):
    """The suggested T2 of /first-rows (30 min) is below the configured 2 h: a job of 50 min is now overdue."""
    store.jobs.insert_many([job_document("/first-rows", "u/slow", started_at=ago(50 * 60), last_heartbeat=ago(10))])
    save_suggestions(store.suggestions, report_suggesting({"/first-rows": 1_800}))
    configured: dict[str, Any] = {"max_duration_seconds_by_type": {"/first-rows": 7_200}}

    kept = run_kill_zombies({**resources, "zombie_policy": ZombiePolicyResource(**configured)})
    assert step_metadata(kept, "report_cleanup")["finalized"] == 0
    opted_in = run_kill_zombies(
        {**resources, "zombie_policy": ZombiePolicyResource(**configured, use_suggested_max_durations=True)}
    )
    assert step_metadata(opted_in, "plan_and_recover")["policy"]["max_duration_seconds_by_type"] == {
        "/first-rows": 1_800
    }
    assert step_metadata(opted_in, "report_cleanup")["reason/exceeded_max_duration"] == 1
    assert [event[Event.THRESHOLD_SECONDS] for event in store.events.find()] == [1_800]


def failures(result) -> list:
    """What each failed step's ``Failure`` told: its description and metadata (not a bare exception)."""
    return [
        event.step_failure_data.user_failure_data
        for event in result.all_events
        if event.is_step_failure and event.step_failure_data.user_failure_data is not None
    ]


def test_a_queue_whose_generation_cannot_be_told_fails_the_run_in_one_line_with_the_candidates(store, resources):
    """A job with 2023-01's ``force`` and 2023-05's ``revision``: no generation has both, so nothing is written."""
    store.jobs.insert_one({**job_document(dataset="u/odd", started_at=ago(3_600)), Job.REVISION: "r1"})

    result = run_kill_zombies(resources)

    assert not result.success
    [failure] = failures(result)
    assert failure.description.startswith("the queue's evidence contradicts itself") and "\n" not in failure.description
    assert "queue_generation" in failure.description
    metadata = {name: value.value for name, value in failure.metadata.items()}
    assert metadata["zombies_found"] == 1 and metadata["queue_generation_candidates"] == []
    assert "queue_generation" in metadata["to_decide"]
    assert store.events.count_documents({}) == 0 and store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 1


def test_an_unreachable_database_fails_the_run_in_seconds_in_one_line_with_where_it_looked(monkeypatch):
    url = f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"  # nothing listens there
    monkeypatch.setenv(QUEUE_URL_ENV, url)
    monkeypatch.setenv(CACHE_URL_ENV, url)
    unreachable = {
        "databases": databases_from_env("unreachable_queue", "unreachable_cache", timeout_ms=300),
        "zombie_policy": ZombiePolicyResource(),
    }

    result = run_kill_zombies(unreachable)

    assert not result.success
    [failure] = failures(result)
    assert failure.description.startswith(
        f"cannot reach MongoDB at {redact_url(url)} (from ${QUEUE_URL_ENV}) within 0.3 s: "
    )
    assert "\n" not in failure.description
    assert {name: value.value for name, value in failure.metadata.items()} == {
        "url": redact_url(url),
        "database": "unreachable_queue",
        "timeout_ms": 300,
        "variable": QUEUE_URL_ENV,
    }
