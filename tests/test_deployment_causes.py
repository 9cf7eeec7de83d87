"""Each cause's finalization, judged by the deployment's own client code (dataset-viewer's ``libcommon`` at pinned
commits): every document our cleanups write loads through its strict models, its counters match, its own backfill
(``CacheState.is_error_to_retry``, today's) re-runs what the cause says should be re-run, and its workers start the
re-runs we enqueue. Skipped, with the command that sets it up, where the client's virtual environment is absent
(see tests/deployment_client/)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from bson import ObjectId

from tests.deployment_client import DeploymentClient
from tests.deployment_client.fixtures import deployment, deployment_session  # noqa: F401  (fixtures)
from tests.helpers import found
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, Quarantine, RetryOutcome
from zombie_pipeline.queue.jobs import Job
from zombie_pipeline.queue.reasons import Cause
from zombie_pipeline.queue.store import Store

ONLY_2023 = pytest.mark.parametrize("deployment_session", ["2023"], indirect=True)
ONLY_CURRENT = pytest.mark.parametrize("deployment_session", ["current"], indirect=True)
KIND = "dataset-config-names"


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def backdate(queue_db: Any, job_id: str, **ages: dt.timedelta) -> None:
    """The job's dates moved back: a worker silent since then, as the real client cannot wait minutes."""
    at = now()
    queue_db.jobsBlue.update_one({"_id": ObjectId(job_id)}, {"$set": {name: at - age for name, age in ages.items()}})


def start(client: DeploymentClient, job_type: str, dataset: str, **namespace: Any) -> str:
    """A job of ``dataset`` created (as the backfill does: it replaces a re-run waiting already) and started by the
    real client; the started job's id."""
    client.run("create_jobs", jobs=[{"type": job_type, "dataset": dataset}])
    started = client.run("start_job", **namespace)
    assert started["started"] and dataset_of(started) == dataset
    return str(started["job_id"])


def dataset_of(started: dict[str, Any]) -> str:
    """The dataset of a job the real client started (its info: flat in 2023, its params since)."""
    info = started["info"]
    return str(info["params"]["dataset"] if "params" in info else info["dataset"])


def earlier_failures(client: DeploymentClient, dataset: str, failed_runs: int) -> None:
    """The dataset's entry after ``failed_runs`` crashes of its job at its revision (the driver's ``main``), a day
    ago."""
    client.run(
        "upsert_response",
        kind=KIND,
        dataset=dataset,
        content={"error": "crashed"},
        http_status=501,
        error_code="JobManagerCrashedError",
        dataset_git_revision="main",
        job_runner_version=1,
        failed_runs=failed_runs,
        updated_at=(now() - dt.timedelta(days=1)).isoformat(),  # before the job that dies now started
    )


def crash_three_times(client: DeploymentClient, store: Store, job_type: str, dataset: str, **namespace: Any) -> None:
    """``dataset``'s job kills its worker three times, each finalized by a cleanup; our error entry of each crash is
    made an hour old before the next start, as crashes hours apart are (else it is fresher than the next job)."""
    for crash in range(3):
        if crash:
            older = {"$set": {"updated_at": now() - dt.timedelta(hours=1)}}
            store.cache.update_many({"dataset": dataset}, older)
        job_id = start(client, job_type, dataset, **namespace)
        backdate(
            store.jobs.database, job_id, started_at=dt.timedelta(minutes=10), last_heartbeat=dt.timedelta(minutes=9)
        )
        run_cleanup(store, ZombiePolicy(), run_id=f"crash-{job_id}")


def backfill(client: DeploymentClient, dataset: str) -> dict[str, Any]:
    [entry] = client.run("backfill_reruns", dataset=dataset)["entries"]
    return dict(entry)


def event_of(store: Store, job_id: str) -> dict[str, Any]:
    return dict(found(store.events.find_one({"_id": ObjectId(job_id)})))


@ONLY_CURRENT
def test_todays_backfill_re_runs_a_deploy_death_and_a_crash_but_no_timeout_nor_quarantine_and_starts_our_re_runs(
    deployment, queue_db, cache_db
) -> None:
    store = Store.of(queue_db, cache_db)
    store.ensure_indexes()
    policy = ZombiePolicy()
    # erin/e's job crashes three times, each cleaned up (the backfill makes the next): quarantined at the third
    crash_three_times(deployment, store, KIND, "erin/e")
    # bob/b's worker is SIGTERMed by a deploy, its job having failed twice before: a third count would end its runs
    sigtermed = start(deployment, KIND, "bob/b")
    earlier_failures(deployment, "bob/b", failed_runs=2)
    deployment.run("set_terminated", job_id=sigtermed)
    backdate(
        queue_db,
        sigtermed,
        started_at=dt.timedelta(minutes=10),
        last_heartbeat=dt.timedelta(minutes=2),
        terminated_at=dt.timedelta(minutes=6),
    )
    # carol/c's worker dies alone after one earlier failure; dave/d's job still beats, 45 minutes in (T2: 20; past
    # the deployment's own 40 and its check: its executor did not stop it, so its re-run need not wait)
    crashed = start(deployment, KIND, "carol/c")
    earlier_failures(deployment, "carol/c", failed_runs=1)
    backdate(queue_db, crashed, started_at=dt.timedelta(minutes=10), last_heartbeat=dt.timedelta(minutes=9))
    overdue = start(deployment, KIND, "dave/d")
    difficulty = found(queue_db.jobsBlue.find_one({"_id": ObjectId(overdue)}))["difficulty"]
    deployment.run("heartbeat", job_id=overdue)
    backdate(queue_db, overdue, started_at=dt.timedelta(minutes=45))

    report = run_cleanup(store, policy, run_id="ours")

    assert (report.counts["cause:deploy"], report.counts["cause:crash"], report.counts["cause:timeout"]) == (1, 1, 1)
    assert report.counts["cache_written"] == 3
    loaded = deployment.run("load_all")
    assert loaded["ok"], loaded["errors"] or loaded["reader_errors"]
    assert deployment.run("recount_metrics")["differences"] == {}
    # the deploy death kept its two failed runs: the backfill would still re-run it; ours waits already
    assert event_of(store, sigtermed)[Event.CAUSE] == Cause.DEPLOY
    assert (backfill(deployment, "bob/b")["failed_runs"], backfill(deployment, "bob/b")["rerun"]) == (2, True)
    # the crash is counted as the deployment counts it, and left to its backfill
    assert event_of(store, crashed)[Event.RETRY_OUTCOME] == RetryOutcome.NOT_RETRIED
    assert (backfill(deployment, "carol/c")["failed_runs"], backfill(deployment, "carol/c")["rerun"]) == (2, True)
    # the timeout: never by the backfill (its code is not retryable), once by us at +20 difficulty
    timeout = backfill(deployment, "dave/d")
    assert (timeout["error_code"], timeout["rerun"]) == ("JobManagerExceededMaximumDurationError", False)
    rerun = found(queue_db.jobsBlue.find_one({Job.DATASET: "dave/d", Job.STATUS: "waiting"}))
    assert rerun["difficulty"] == min(difficulty + 20, 100)
    # the quarantined pair: at the deployment's limit, so its backfill leaves it alone as we do; its entry says why
    assert (backfill(deployment, "erin/e")["failed_runs"], backfill(deployment, "erin/e")["rerun"]) == (3, False)
    assert store.quarantine.count_documents({Quarantine.DATASET: "erin/e", Quarantine.JOB_TYPE: KIND}) == 1
    entry = found(cache_db.cachedResponsesBlue.find_one({"dataset": "erin/e"}))
    assert "quarantined" in entry["content"]["error"] and entry["details"]["cause"] == Cause.CRASH
    # the real client's workers start our two re-runs, and nothing of erin/e
    started = []
    while (job := deployment.run("start_job"))["started"]:
        started.append(dataset_of(job))
    assert sorted(started) == ["bob/b", "dave/d"]
    assert deployment.run("load_all")["ok"]


@ONLY_2023
def test_at_the_early_2023_queue_a_wave_runs_again_a_quarantine_does_not_and_the_real_client_loads_it_all(
    deployment, queue_db, cache_db
) -> None:
    store = Store.of(queue_db, cache_db)
    store.ensure_indexes()
    policy = ZombiePolicy()
    one_per_namespace = {"max_jobs_per_namespace": 1}
    crash_three_times(deployment, store, "/splits", "user/poison", **one_per_namespace)
    wave = [start(deployment, "/splits", f"user{n}/data", **one_per_namespace) for n in range(10)]
    for n, job_id in enumerate(wave):  # ten workers stopped within 10 seconds
        silent = dt.timedelta(minutes=8, seconds=n)
        backdate(queue_db, job_id, started_at=dt.timedelta(minutes=12), last_heartbeat=silent)

    report = run_cleanup(store, policy, run_id="ours")

    assert report.counts["cause:deploy"] == 10
    assert {event_of(store, job_id)[Event.RETRY_OUTCOME] for job_id in wave} == {RetryOutcome.ENQUEUED}
    poisoned = store.events.find({f"{Event.JOB}.{Job.DATASET}": "user/poison"}).sort(Event.FINALIZED_AT, 1)
    assert [event[Event.RETRY_OUTCOME] for event in poisoned][-1] == RetryOutcome.QUARANTINED
    loaded = deployment.run("load_all")
    assert loaded["ok"], loaded["errors"] or loaded["reader_errors"]
    state = deployment.run("state")
    finished = {row["id"]: row["status"] for row in state["jobs"]}
    assert {finished[job_id] for job_id in wave} == {"error"}  # kept, as the deployment keeps finished jobs
    started = []
    while (job := deployment.run("start_job", **one_per_namespace))["started"]:
        started.append(dataset_of(job))
    assert sorted(started) == sorted(f"user{n}/data" for n in range(10))  # the wave's re-runs, none of user/poison's
    assert deployment.run("load_all")["ok"]
