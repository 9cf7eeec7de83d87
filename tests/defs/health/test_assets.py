"""Asset checks on queue_health: the invariants a cleanup leaves, judged on the real server."""

import datetime as dt
import time

import dagster as dg
import pytest

from tests.helpers import ago, crashed_job, job_document, workload
from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.health.assets import (
    cleanups_are_recent,
    compensations_succeed,
    no_zombies_left,
    queue_health,
    queue_health_job,
    zombies_have_cache_errors,
)
from zombie_pipeline.defs.resources import (
    ZombiePolicyResource,
)
from zombie_pipeline.defs.tags import CLEANUP_RUN_TAG, JOB_TYPE_PARTITIONS
from zombie_pipeline.queue.audit_documents import Event
from zombie_pipeline.queue.cache import Cache, ErrorCode, cache_key_of_job
from zombie_pipeline.queue.jobs import ID, Job, JobSnapshot
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.simulation.simulator import simulate

TIMEOUT = 300  # the policy resource's default heartbeat timeout


@pytest.fixture
def defs(resources):
    return dg.Definitions(
        assets=[queue_health],
        asset_checks=[no_zombies_left, zombies_have_cache_errors, compensations_succeed, cleanups_are_recent],
        jobs=[kill_zombies_job, queue_health_job],
        resources=resources,
    )


def cleanup(defs, instance, partition_key=None, job_types=None) -> str:
    if partition_key:
        instance.add_dynamic_partitions(JOB_TYPE_PARTITIONS.name, [partition_key])
    run_config = {"ops": {"plan_and_recover": {"config": {"job_types": job_types}}}} if job_types else None
    result = defs.resolve_job_def(kill_zombies_job.name).execute_in_process(
        instance=instance, partition_key=partition_key, run_config=run_config
    )
    assert result.success
    return result.run_id


def check_results(defs, instance, after_cleanup: str | None = None, run_config=None) -> dict:
    tags = {CLEANUP_RUN_TAG: after_cleanup} if after_cleanup else None
    job = defs.resolve_job_def(queue_health_job.name)
    result = job.execute_in_process(instance=instance, tags=tags, run_config=run_config)
    assert result.success  # a failed check is a result, not a failed run
    return {evaluation.check_name: evaluation for evaluation in result.get_asset_check_evaluations()}


def metadata(evaluation) -> dict:
    return {name: value.value for name, value in evaluation.metadata.items()}


def test_queue_health_job_materializes_the_snapshot_and_runs_its_checks(store, defs, instance):
    simulate(store, workload(finished=50, crashed=3, never_heartbeated=1, overdue=1, running=10, waiting=4, seed=3))
    result = defs.resolve_job_def(queue_health_job.name).execute_in_process(instance=instance)
    [materialization] = result.asset_materializations_for_node(queue_health.op.name)
    values = {name: value.value for name, value in materialization.metadata.items()}
    assert (values["started"], values["waiting"], values["stale"]) == (15, 4, 5)
    assert values["policy"]["heartbeat_timeout_seconds"] == TIMEOUT
    assert {e.check_name for e in result.get_asset_check_evaluations()} == {
        "no_zombies_left",
        "zombies_have_cache_errors",
        "compensations_succeed",
        "cleanups_are_recent",
    }


def test_zombies_before_any_cleanup_fail_no_zombies_left_with_their_evidence(store, defs, instance):
    store.jobs.insert_many([crashed_job("user/a"), crashed_job("user/b")])
    evaluation = check_results(defs, instance)["no_zombies_left"]
    assert not evaluation.passed
    assert metadata(evaluation)["zombies_left"] == 2
    assert {row.data["dataset"] for row in metadata(evaluation)["zombies"].records} == {"user/a", "user/b"}


def test_after_a_cleanup_both_checks_pass(store, defs, instance):
    simulate(store, workload(finished=50, crashed=4, never_heartbeated=2, overdue=2, running=10, waiting=4, seed=5))
    run_id = cleanup(defs, instance)
    evaluations = check_results(defs, instance, after_cleanup=run_id)
    assert evaluations["no_zombies_left"].passed
    assert metadata(evaluations["no_zombies_left"])["cleanup_run"] == run_id
    assert evaluations["zombies_have_cache_errors"].passed
    assert metadata(evaluations["zombies_have_cache_errors"])["finalizations_checked"] == 8


def test_cleanups_are_recent_fails_before_any_successful_cleanup_of_the_queue_and_passes_after_one(
    store, defs, instance
):
    before = check_results(defs, instance)["cleanups_are_recent"]
    assert not before.passed and "no successful cleanup of queue database" in before.description
    run_id = cleanup(defs, instance)
    after = check_results(defs, instance, after_cleanup=run_id)["cleanups_are_recent"]
    assert after.passed and metadata(after)["last_successful_cleanup_run"] == run_id
    assert metadata(after)["minutes_since"] < 1 and metadata(after)["limit_minutes"] == 30


def test_a_partitioned_cleanup_is_judged_on_its_own_job_type(store, defs, instance):
    store.jobs.insert_many([crashed_job("user/a", "/splits"), crashed_job("user/b", "/first-rows")])
    run_id = cleanup(defs, instance, partition_key="/splits")
    assert check_results(defs, instance, after_cleanup=run_id)["no_zombies_left"].passed
    assert not check_results(defs, instance)["no_zombies_left"].passed  # /first-rows is still a zombie


def test_a_cleanup_of_configured_job_types_is_judged_on_those_types(store, defs, instance):
    store.jobs.insert_many(
        [crashed_job("user/a", "/splits"), crashed_job("user/b", "/parquet"), crashed_job("user/c", "/first-rows")]
    )
    run_id = cleanup(defs, instance, job_types=["/splits", "/parquet"])
    evaluation = check_results(defs, instance, after_cleanup=run_id)["no_zombies_left"]
    assert evaluation.passed
    assert metadata(evaluation)["job_types"] == ["/splits", "/parquet"]


def test_a_job_that_went_stale_after_the_cleanup_started_is_not_held_against_it(store, defs, instance):
    run_id = cleanup(defs, instance)
    started_at = dt.datetime.fromtimestamp(instance.get_run_record_by_id(run_id).start_time, dt.UTC)
    # alive when the cleanup started (last beat just inside the timeout), dead a moment later
    store.jobs.insert_one(
        job_document(started_at=ago(900), last_heartbeat=started_at - dt.timedelta(seconds=TIMEOUT - 1))
    )
    time.sleep(max(0.0, (started_at + dt.timedelta(seconds=1.5) - utc_now()).total_seconds()))
    assert check_results(defs, instance, after_cleanup=run_id)["no_zombies_left"].passed
    assert not check_results(defs, instance)["no_zombies_left"].passed


def _finalized_jobs(store, defs, instance, count: int) -> list[JobSnapshot]:
    store.jobs.insert_many([crashed_job(f"user/{i}") for i in range(count)])
    cleanup(defs, instance)
    return [event[Event.JOB] for event in store.events.find().sort(ID, 1)]


def test_a_deleted_cache_error_fails_the_cache_check(store, defs, instance):
    [job, _] = _finalized_jobs(store, defs, instance, 2)
    store.cache.delete_one(cache_key_of_job(job))
    evaluation = check_results(defs, instance)["zombies_have_cache_errors"]
    assert not evaluation.passed
    assert (metadata(evaluation)["missing_entries"], metadata(evaluation)["entries_without_error"]) == (1, 0)
    [row] = metadata(evaluation)["offenders"].records
    assert row.data["job_id"] == str(job[ID])


def test_an_older_entry_without_the_error_fails_the_cache_check(store, defs, instance):
    [job] = _finalized_jobs(store, defs, instance, 1)
    store.cache.replace_one(cache_key_of_job(job), cache_document(job, updated_at=ago(3_600)))
    evaluation = check_results(defs, instance)["zombies_have_cache_errors"]
    assert not evaluation.passed
    assert metadata(evaluation)["entries_without_error"] == 1


def test_a_newer_result_replacing_the_error_is_the_queue_moving_on(store, defs, instance):
    [job] = _finalized_jobs(store, defs, instance, 1)
    retried: JobSnapshot = {**job, Job.STARTED_AT: utc_now()}
    store.cache.replace_one(
        cache_key_of_job(job), cache_document(retried, updated_at=utc_now() + dt.timedelta(seconds=1))
    )
    assert check_results(defs, instance)["zombies_have_cache_errors"].passed


def test_the_cache_check_only_looks_at_the_configured_days(store, defs, instance):
    [job] = _finalized_jobs(store, defs, instance, 1)
    store.cache.delete_one(cache_key_of_job(job))
    store.events.update_one({ID: job[ID]}, {"$set": {Event.FINALIZED_AT: ago(3 * 86_400)}})
    assert not check_results(defs, instance)["zombies_have_cache_errors"].passed  # 7 days by default
    two_days = {"ops": {zombies_have_cache_errors.node_def.name: {"config": {"days": 2}}}}
    evaluation = check_results(defs, instance, run_config=two_days)["zombies_have_cache_errors"]
    assert evaluation.passed
    assert metadata(evaluation)["finalizations_checked"] == 0


def test_the_error_code_checked_is_the_one_the_event_recorded(store, defs, instance):
    [job] = _finalized_jobs(store, defs, instance, 1)
    assert store.cache.find_one(cache_key_of_job(job))[Cache.ERROR_CODE] == ErrorCode.CRASHED
    store.events.update_one({ID: job[ID]}, {"$set": {Event.ERROR_CODE: ErrorCode.EXCEEDED_MAX_DURATION}})
    assert not check_results(defs, instance)["zombies_have_cache_errors"].passed


def test_failing_compensations_warn_while_retried_and_fail_once_given_up_on(store, resources, instance, monkeypatch):
    """A webhook that cannot be reached: a warning after the first cleanup, an error once its attempts are spent."""
    monkeypatch.setenv("UNREACHABLE_HOOK", "http://127.0.0.1:9/hook")  # the discard port: nothing listens
    resources = {
        **resources,
        "zombie_policy": ZombiePolicyResource(
            compensation_webhooks={"*": "UNREACHABLE_HOOK"}, compensation_max_attempts=2
        ),
    }
    defs = dg.Definitions(
        assets=[queue_health],
        asset_checks=[compensations_succeed],
        jobs=[kill_zombies_job, queue_health_job],
        resources=resources,
    )
    store.jobs.insert_one(crashed_job())
    seen = []
    for _ in range(2):
        cleanup(defs, instance)
        evaluation = check_results(defs, instance)["compensations_succeed"]
        seen.append(
            (
                evaluation.passed,
                evaluation.severity,
                metadata(evaluation)["given_up"],
                metadata(evaluation)["failing_to_retry"],
            )
        )
    assert seen == [(False, dg.AssetCheckSeverity.WARN, 0, 1), (False, dg.AssetCheckSeverity.ERROR, 1, 0)]
    assert "POST http://127.0.0.1:9/…" in str(metadata(evaluation)["failing"])
