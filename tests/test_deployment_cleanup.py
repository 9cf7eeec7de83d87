"""Our cleanup, judged by the deployment's own client code (dataset-viewer's ``libcommon`` at pinned commits).

Jobs are created, started and heartbeated by the real client; the zombie's worker
"dies" (its dates are moved back in time, as if it had been silent for minutes);
our cleanup runs; then the real client loads every collection through its strict
models, recounts its counters, and starts the re-run. For today's queue the
deployment's own finish is run on the same scenario in other databases, and both
results are compared document by document. Skipped, with the command that sets it
up, where the client's virtual environment is absent (see tests/deployment_client/).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from bson import ObjectId

from tests.deployment_client import DeploymentClient
from tests.deployment_client.fixtures import deployment, deployment_session  # noqa: F401  (fixtures)
from tests.helpers import found
from zombie_pipeline.cleanup import run
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.store import Store
from zombie_pipeline.statistics.cache_source import read_cache_period

ONLY_2023 = pytest.mark.parametrize("deployment_session", ["2023"], indirect=True)
ONLY_CURRENT = pytest.mark.parametrize("deployment_session", ["current"], indirect=True)
NOW = dt.datetime.now(dt.UTC)
PARQUET = "config-parquet-and-info"


def backdate(queue_db, job_id: str, **ages: dt.timedelta) -> None:
    """The job's dates moved back: a worker silent since then, as the real client cannot wait minutes."""
    queue_db.jobsBlue.update_one({"_id": ObjectId(job_id)}, {"$set": {name: NOW - age for name, age in ages.items()}})


def todays_scenario(client: DeploymentClient, queue_db, cache_db) -> str:
    """alice/a's parquet job crashed 9 minutes ago after 40 minutes of work, with its dataset near its hourly limit;
    one more job of alice/a waits; bob's job runs. Returns the zombie's id."""
    zombie, alive, _ = client.run(
        "create_jobs",
        jobs=[
            {"type": PARQUET, "dataset": "alice/a", "config": "default", "revision": "rev-2", "difficulty": 70},
            {"type": "dataset-config-names", "dataset": "bob/b", "difficulty": 50},
            {"type": "split-first-rows", "dataset": "alice/a", "config": "default", "split": "train", "difficulty": 30},
        ],
    )["job_ids"]
    assert client.run("start_job", difficulty_max=80)["job_id"] == zombie
    assert client.run("start_job")["job_id"] == alive
    client.run("heartbeat", job_id=zombie)
    client.run("heartbeat", job_id=alive)
    client.run(
        "upsert_response",
        kind=PARQUET,
        dataset="alice/a",
        config="default",
        content={"previous": True},
        http_status=500,
        error_code="UnexpectedError",
        dataset_git_revision="rev-2",
        job_runner_version=3,
        failed_runs=1,
        progress=1.0,
        duration=3.0,
    )
    cache_db.cachedResponsesBlue.update_one(
        {"dataset": "alice/a"}, {"$set": {"updated_at": NOW - dt.timedelta(hours=2)}}
    )
    backdate(queue_db, zombie, started_at=dt.timedelta(minutes=49), last_heartbeat=dt.timedelta(minutes=9))
    queue_db.pastJobs.insert_one(
        {"dataset": "alice/a", "duration": 5_000, "finished_at": NOW - dt.timedelta(minutes=20)}
    )
    return zombie


def comparable(state: dict[str, Any]) -> dict[str, Any]:
    """A state as both sides may be compared: by unicity id, without stamps."""
    return {
        "jobs": sorted((job["unicity_id"], job["status"]) for job in state["jobs"]),
        "locks": sorted(state["locks"].items()),
        "past_jobs": sorted(
            (row["dataset"], row["duration"] // 10) for row in state["past_jobs"]
        ),  # seconds of a finish apart
        "blockages": sorted(row["dataset"] for row in state["blockages"]),
        "cache": sorted((row["kind"], row["dataset"], row["http_status"], row["error_code"]) for row in state["cache"]),
    }


@ONLY_CURRENT
def test_todays_deployment_would_leave_what_our_cleanup_leaves(deployment, queue_db, cache_db, fresh_database) -> None:
    ours = todays_scenario(deployment, queue_db, cache_db)
    theirs_queue, theirs_cache = fresh_database("theirs_queue"), fresh_database("theirs_cache")
    deployment.use(theirs_queue.name, theirs_cache.name)
    theirs = todays_scenario(deployment, theirs_queue, theirs_cache)
    # the deployment's own kill of a stuck job: the error entry, then the finish (services/worker job_manager.set_stuck)
    deployment.run(
        "upsert_response",
        kind=PARQUET,
        dataset="alice/a",
        config="default",
        content={"error": "crashed"},
        details={"error": "crashed"},
        http_status=501,
        error_code="JobManagerCrashedError",
        dataset_git_revision="rev-2",
        job_runner_version=3,
        failed_runs=2,
        duration=49 * 60.0,
    )
    deployment.run("finish_job", job_id=theirs)
    expected = deployment.run("state")
    expected_counters = deployment.run("recount_metrics")

    deployment.use(queue_db.name, cache_db.name)
    # 49 minutes is past the default 20-minute maximum duration, but the worker is dead: the deployment's
    # kill_stuck_jobs finishes it as crashed whatever its age, and so do we
    report = run_cleanup(Store.of(queue_db, cache_db), ZombiePolicy(), run_id="ours")

    assert found(report.generations.queue).name == "2026-05"
    assert report.counts["finalized"] == 1 and report.counts["effect:blocked_dataset"] == 1
    assert report.counts["reason:missing_heartbeat"] == 1
    assert comparable(deployment.run("state")) == comparable(expected)
    assert deployment.run("recount_metrics")["differences"] == expected_counters["differences"]
    entry = cache_db.cachedResponsesBlue.find_one({"dataset": "alice/a"})
    assert (entry["http_status"], entry["error_code"], entry["dataset_git_revision"], entry["failed_runs"]) == (
        501,
        "JobManagerCrashedError",
        "rev-2",
        2,
    )
    assert queue_db.jobsBlue.find_one({"_id": ObjectId(ours)}) is None


@ONLY_CURRENT
def test_after_our_cleanup_todays_deployment_loads_everything_its_counters_match_and_the_re_run_starts(
    deployment, queue_db, cache_db
) -> None:
    zombie, _ = deployment.run(
        "create_jobs",
        jobs=[
            {"type": "dataset-config-names", "dataset": "alice/a"},
            {"type": "dataset-config-names", "dataset": "bob/b"},
        ],
    )["job_ids"]
    deployment.run("start_job")
    deployment.run("start_job")
    backdate(queue_db, zombie, started_at=dt.timedelta(minutes=10), last_heartbeat=dt.timedelta(minutes=9))
    assert [job["job_id"] for job in deployment.run("find_stuck", max_seconds_without_heartbeat=300)["jobs"]] == [
        zombie
    ]

    run_cleanup(Store.of(queue_db, cache_db), ZombiePolicy(), run_id="ours")

    loaded = deployment.run("load_all")
    assert loaded["ok"], loaded["errors"] or loaded["reader_errors"]
    assert deployment.run("recount_metrics")["differences"] == {}
    assert deployment.run("find_stuck", max_seconds_without_heartbeat=300)["jobs"] == []
    rerun = deployment.run("create_jobs", jobs=[{"type": "dataset-config-names", "dataset": "alice/a"}])[
        "job_ids"
    ]  # the backfill's
    started = deployment.run("start_job")
    assert started["started"] and started["job_id"] == rerun[0]


@ONLY_CURRENT
def test_a_job_sigtermed_long_ago_is_finalized_as_terminated_as_the_deployment_judges_it(
    deployment, queue_db, cache_db
) -> None:
    [job_id] = deployment.run("create_jobs", jobs=[{"type": "dataset-config-names", "dataset": "bob/b"}])["job_ids"]
    deployment.run("start_job")
    deployment.run("set_terminated", job_id=job_id)
    backdate(
        queue_db,
        job_id,
        started_at=dt.timedelta(minutes=10),
        last_heartbeat=dt.timedelta(minutes=2),
        terminated_at=dt.timedelta(minutes=6),
    )
    assert deployment.run("find_stuck", max_seconds_without_heartbeat=300)["jobs"] == [
        {"job_id": job_id, "reason": "terminated"}
    ]

    report = run_cleanup(Store.of(queue_db, cache_db), ZombiePolicy(), run_id="ours")

    assert report.counts["reason:terminated"] == 1
    assert deployment.run("load_all")["ok"]
    assert deployment.run("recount_metrics")["differences"] == {}


@ONLY_CURRENT
def test_a_worker_heartbeating_through_the_real_client_after_detection_keeps_its_job(
    deployment, queue_db, cache_db
) -> None:
    [job_id] = deployment.run("create_jobs", jobs=[{"type": "dataset-config-names", "dataset": "alice/a"}])["job_ids"]
    deployment.run("start_job")
    backdate(queue_db, job_id, started_at=dt.timedelta(minutes=10), last_heartbeat=dt.timedelta(minutes=9))
    store = Store.of(queue_db, cache_db)
    plan = run.prepare(store, ZombiePolicy(), "ours").plan
    detection = run.find(store, plan)
    assert len(detection.candidates) == 1

    deployment.run("heartbeat", job_id=job_id)
    result = run.claim_and_finalize(store, plan, detection.candidates)

    assert result.counts["lost_to_live_worker"] == 1
    assert [job["status"] for job in deployment.run("state")["jobs"]] == ["started"]
    assert deployment.run("state")["cache"] == []
    assert deployment.run("recount_metrics")["differences"] == {}


@ONLY_CURRENT
def test_a_second_cleanup_leaves_todays_queue_as_the_first_left_it(deployment, queue_db, cache_db) -> None:
    todays_scenario(deployment, queue_db, cache_db)
    store = Store.of(queue_db, cache_db)
    run_cleanup(store, ZombiePolicy(), run_id="first")
    before = deployment.run("state")

    run_cleanup(store, ZombiePolicy(), run_id="second")

    assert deployment.run("state") == before


@ONLY_2023
def test_the_retry_of_an_early_2023_zombie_is_a_job_the_real_client_starts(deployment, queue_db, cache_db) -> None:
    [zombie] = deployment.run("create_jobs", jobs=[{"type": "/splits", "dataset": "alice/a"}])["job_ids"]
    deployment.run("start_job", max_jobs_per_namespace=1)
    backdate(queue_db, zombie, started_at=dt.timedelta(minutes=10), last_heartbeat=dt.timedelta(minutes=9))

    report = run_cleanup(Store.of(queue_db, cache_db), ZombiePolicy(), run_id="ours")

    assert found(report.generations.queue).name == "2023-01" and report.counts["retry_enqueued"] == 1
    assert deployment.run("load_all")["ok"]
    started = deployment.run("start_job", max_jobs_per_namespace=1)
    assert started["started"] and started["info"]["dataset"] == "alice/a" and started["job_id"] != zombie
    assert deployment.run("load_all")["ok"]


@ONLY_2023
def test_an_early_2023_job_dead_for_longer_than_its_maximum_duration_is_a_crash_whose_retry_the_real_client_starts(
    deployment, queue_db, cache_db
) -> None:
    [zombie] = deployment.run("create_jobs", jobs=[{"type": "/splits", "dataset": "alice/a"}])["job_ids"]
    deployment.run("start_job", max_jobs_per_namespace=1)
    backdate(queue_db, zombie, started_at=dt.timedelta(minutes=45), last_heartbeat=dt.timedelta(minutes=40))

    report = run_cleanup(Store.of(queue_db, cache_db), ZombiePolicy(), run_id="ours")  # T2: 20 minutes

    assert report.counts["reason:missing_heartbeat"] == 1 and report.counts["retry_enqueued"] == 1
    assert cache_db.cachedResponsesBlue.find_one({"dataset": "alice/a"})["error_code"] == "JobManagerCrashedError"
    assert deployment.run("load_all")["ok"]
    started = deployment.run("start_job", max_jobs_per_namespace=1)
    assert started["started"] and started["info"]["dataset"] == "alice/a" and started["job_id"] != zombie


@ONLY_CURRENT
def test_the_indexes_we_create_are_the_ones_todays_deployment_creates_at_its_startup_without_a_conflict(
    deployment, queue_db, cache_db
) -> None:
    deployment.run("create_jobs", jobs=[{"type": "dataset-config-names", "dataset": "alice/a"}])
    deployment.run(
        "upsert_response",
        kind="dataset-config-names",
        dataset="alice/a",
        content={},
        http_status=200,
        dataset_git_revision="r1",
    )
    store = Store.of(queue_db, cache_db)
    store.ensure_indexes()
    read_cache_period(
        store.cache, store.events, NOW - dt.timedelta(days=1), NOW, create_index=True
    )  # creates kind_updated

    startup = deployment.run("ensure_indexes")

    assert startup["ok"], str(startup["errors"])[:3000]
    cache_indexes = startup["indexes"]["cachedResponsesBlue"]
    assert cache_indexes["kind_updated"] == [["kind", 1], ["updated_at", 1], ["dataset", 1]]
    keys = [tuple(map(tuple, key)) for key in cache_indexes.values()]
    assert len(keys) == len(set(keys))  # no index twice under two names
