"""The free re-runs' budget (docs/causes.md), judged by the deployment's own client code: its workers start the free
re-runs we enqueue, its backfill (``CacheState.is_error_to_retry``, today's) re-runs the lone SIGTERM charged past the
budget at the difficulty its failed runs give, and leaves the quarantine alone; every document loads through its
strict models and its counters match a recount. Skipped, with the command that sets it up, where the client's
virtual environment is absent (see tests/deployment_client/)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bson import ObjectId

from tests.deployment_client import DeploymentClient
from tests.deployment_client.fixtures import deployment, deployment_session  # noqa: F401  (fixtures)
from tests.helpers import found
from tests.test_deployment_causes import KIND, ONLY_2023, ONLY_CURRENT, backdate, backfill, dataset_of, event_of, start
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.messages import (
    DEPLOY_WAVE_MESSAGE,
    quarantine_message,
    terminated_alone_message,
    terminated_too_often_message,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, FreeRuns, RetryOutcome
from zombie_pipeline.queue.cache import CACHE_CONTENT_ERROR, Cache
from zombie_pipeline.queue.reasons import Cause
from zombie_pipeline.queue.store import Store

EVICTED = "evicted/e"
#: Between two deaths of EVICTED: the finalizations and cache entries are moved back by this, as deaths hours apart
#: are (the real client cannot wait hours; an entry newer than the next job's start would be fresher than its error,
#: and a wave's deaths would still be recent to the next run).
APART = dt.timedelta(hours=8)
MINUTE = dt.timedelta(minutes=1)


def hours_pass(store: Store) -> None:
    """Every finalization and cache entry moved :data:`APART` back in time."""
    back = int(APART.total_seconds() * 1000)
    store.events.update_many({}, [{"$set": {Event.FINALIZED_AT: {"$subtract": [f"${Event.FINALIZED_AT}", back]}}}])
    store.cache.update_many({}, [{"$set": {Cache.UPDATED_AT: {"$subtract": [f"${Cache.UPDATED_AT}", back]}}}])


def sigterm_alone(client: DeploymentClient, queue_db: Any, job_id: str) -> None:
    """The worker of ``job_id`` SIGTERMed 6 minutes ago (the real client records it), its last beat a minute later."""
    client.run("set_terminated", job_id=job_id)
    backdate(queue_db, job_id, started_at=10 * MINUTE, last_heartbeat=5 * MINUTE, terminated_at=6 * MINUTE)


def go_silent(queue_db: Any, job_ids: list[str], terminated: str | None = None) -> None:
    """The workers of ``job_ids`` stopped within seconds of each other, 8 minutes ago (a wave); ``terminated``'s
    SIGTERMed a minute before."""
    for n, job_id in enumerate(job_ids):
        silent = dt.timedelta(minutes=8, seconds=n)
        sigterm = {"terminated_at": silent + MINUTE} if job_id == terminated else {}
        backdate(queue_db, job_id, started_at=12 * MINUTE, last_heartbeat=silent, **sigterm)


def started_jobs(client: DeploymentClient, **namespace: Any) -> dict[str, str]:
    """Every waiting job started by the real client's workers: dataset -> job id."""
    started = {}
    while (job := client.run("start_job", **namespace))["started"]:
        started[dataset_of(job)] = str(job["job_id"])
    return started


def message(cache_db: Any) -> str:
    return str(found(cache_db.cachedResponsesBlue.find_one({"dataset": EVICTED}))["content"][CACHE_CONTENT_ERROR])


def difficulty_of(queue_db: Any, job_id: str) -> int:
    return int(found(queue_db.jobsBlue.find_one({"_id": ObjectId(job_id)}))["difficulty"])


def backfill_difficulty(client: DeploymentClient) -> int:
    [entry] = client.run("backfill_difficulty", dataset=EVICTED)["entries"]
    return int(entry["difficulty"])


def all_loaded_and_counted(client: DeploymentClient) -> None:
    loaded = client.run("load_all")
    assert loaded["ok"], loaded["errors"] or loaded["reader_errors"]
    assert client.run("recount_metrics")["differences"] == {}


@ONLY_CURRENT
def test_todays_client_runs_three_free_re_runs_its_backfill_the_charged_fourth_at_plus_20_a_wave_free_then_quarantine(
    deployment, queue_db, cache_db
) -> None:
    store = Store.of(queue_db, cache_db)
    store.ensure_indexes()
    policy = ZombiePolicy()
    job_id = start(deployment, KIND, EVICTED)
    difficulty = difficulty_of(queue_db, job_id)

    # evicted alone three times, 8 hours apart: each a free re-run, enqueued at once, that the real client starts
    for n in range(1, 4):
        sigterm_alone(deployment, queue_db, job_id)
        run_cleanup(store, policy, run_id=f"alone-{n}")
        event = event_of(store, job_id)
        assert (event[Event.CAUSE], event[Event.RETRY_OUTCOME]) == (Cause.DEPLOY, RetryOutcome.ENQUEUED)
        assert (event[Event.FREE_RUNS][FreeRuns.FREE], event[Event.FREE_RUNS][FreeRuns.CHARGED]) == (n, False)
        assert backfill(deployment, EVICTED)["failed_runs"] == 0  # no failed run counted
        assert message(cache_db) == terminated_alone_message(n, 3, 72)
        all_loaded_and_counted(deployment)
        hours_pass(store)
        started = deployment.run("start_job")
        assert started["started"] and started["job_id"] == str(event[Event.RETRY_JOB_ID])
        job_id = str(started["job_id"])
        assert difficulty_of(queue_db, job_id) == difficulty

    # the fourth within 72 hours: a failed run, which today's backfill re-runs at +20; nothing of ours waits
    sigterm_alone(deployment, queue_db, job_id)
    run_cleanup(store, policy, run_id="alone-4")
    charged = event_of(store, job_id)
    assert (charged[Event.CAUSE], charged[Event.RETRY_OUTCOME]) == (Cause.CRASH, RetryOutcome.NOT_RETRIED)
    assert (charged[Event.FREE_RUNS][FreeRuns.ALONE], charged[Event.FREE_RUNS][FreeRuns.CHARGED]) == (4, True)
    assert (backfill(deployment, EVICTED)["failed_runs"], backfill(deployment, EVICTED)["rerun"]) == (1, True)
    assert backfill_difficulty(deployment) == difficulty + 20
    assert message(cache_db) == terminated_too_often_message(4, 72)
    assert deployment.run("start_job")["started"] is False
    all_loaded_and_counted(deployment)
    hours_pass(store)

    # the backfill's job, SIGTERMed in a wave of ten datasets' workers: free, its failed run kept, re-run at once
    deployment.run("create_jobs", jobs=[{"type": KIND, "dataset": EVICTED, "difficulty": difficulty + 20}])
    job_id = str(deployment.run("start_job")["job_id"])
    deployment.run("set_terminated", job_id=job_id)
    wave = [job_id, *(start(deployment, KIND, f"user{n}/data") for n in range(9))]
    go_silent(queue_db, wave, terminated=job_id)
    report = run_cleanup(store, policy, run_id="wave")
    assert report.counts["cause:deploy"] == 10
    in_wave = event_of(store, job_id)
    assert (in_wave[Event.CAUSE], in_wave[Event.IN_WAVE], Event.FREE_RUNS in in_wave) == (Cause.DEPLOY, True, False)
    assert (in_wave[Event.RETRY_OUTCOME], backfill(deployment, EVICTED)["failed_runs"]) == (RetryOutcome.ENQUEUED, 1)
    assert message(cache_db) == DEPLOY_WAVE_MESSAGE
    all_loaded_and_counted(deployment)
    hours_pass(store)
    reruns = started_jobs(deployment)
    assert set(reruns) == {EVICTED, *(f"user{n}/data" for n in range(9))}
    assert (
        reruns[EVICTED] == str(in_wave[Event.RETRY_JOB_ID])
        and difficulty_of(queue_db, reruns[EVICTED]) == difficulty + 20
    )
    for dataset, other in reruns.items():
        if dataset != EVICTED:
            deployment.run("finish_job", job_id=other)

    # two crashes more, each re-run by the backfill 20 harder: the third crash in 72 hours quarantines the pair
    job_id = reruns[EVICTED]
    for crash in (2, 3):
        backdate(queue_db, job_id, started_at=10 * MINUTE, last_heartbeat=9 * MINUTE)
        run_cleanup(store, policy, run_id=f"crash-{crash}")
        assert backfill(deployment, EVICTED)["failed_runs"] == crash
        all_loaded_and_counted(deployment)
        if crash == 2:
            assert backfill(deployment, EVICTED)["rerun"] and backfill_difficulty(deployment) == difficulty + 40
            hours_pass(store)
            deployment.run("create_jobs", jobs=[{"type": KIND, "dataset": EVICTED, "difficulty": difficulty + 40}])
            job_id = str(deployment.run("start_job")["job_id"])
    assert event_of(store, job_id)[Event.RETRY_OUTCOME] == RetryOutcome.QUARANTINED
    assert backfill(deployment, EVICTED)["rerun"] is False
    assert message(cache_db) == quarantine_message(3, 72)
    assert deployment.run("start_job")["started"] is False


@ONLY_2023
def test_at_the_early_2023_queue_a_pair_in_four_waves_runs_free_each_time_and_alone_crashes_into_a_quarantine(
    deployment, queue_db, cache_db
) -> None:
    """No SIGTERM is recorded in 2023: no death alone is free, so there is no budget; waves are free every time."""
    store = Store.of(queue_db, cache_db)
    store.ensure_indexes()
    policy = ZombiePolicy()
    one_per_namespace = {"max_jobs_per_namespace": 1}
    job_id = start(deployment, KIND, EVICTED, **one_per_namespace)

    for w in range(4):  # a wave of ten datasets' workers, EVICTED's among them, every 8 hours
        others = [start(deployment, KIND, f"user{n}-{w}/data", **one_per_namespace) for n in range(9)]
        go_silent(queue_db, [job_id, *others])
        report = run_cleanup(store, policy, run_id=f"wave-{w}")
        assert report.counts["cause:deploy"] == 10
        event = event_of(store, job_id)
        assert (event[Event.CAUSE], event[Event.IN_WAVE], event[Event.FAILED_RUNS]) == (Cause.DEPLOY, True, 0)
        assert event[Event.RETRY_OUTCOME] == RetryOutcome.ENQUEUED and message(cache_db) == DEPLOY_WAVE_MESSAGE
        all_loaded_and_counted(deployment)
        hours_pass(store)
        reruns = started_jobs(deployment, **one_per_namespace)
        assert set(reruns) == {EVICTED, *(f"user{n}-{w}/data" for n in range(9))}
        assert reruns[EVICTED] == str(event[Event.RETRY_JOB_ID])
        for dataset, other in reruns.items():
            if dataset != EVICTED:
                deployment.run("finish_job", job_id=other, status="success")
        job_id = reruns[EVICTED]

    # alone, its worker dies three times: a crash each time, re-run by the cleanup, quarantined at the third
    for crash in (1, 2, 3):
        backdate(queue_db, job_id, started_at=10 * MINUTE, last_heartbeat=9 * MINUTE)
        run_cleanup(store, policy, run_id=f"crash-{crash}")
        event = event_of(store, job_id)
        assert (event[Event.CAUSE], event[Event.FAILED_RUNS]) == (Cause.CRASH, crash)
        all_loaded_and_counted(deployment)
        hours_pass(store)
        if crash < 3:
            assert event[Event.RETRY_OUTCOME] == RetryOutcome.ENQUEUED
            started = deployment.run("start_job", **one_per_namespace)
            assert started["job_id"] == str(event[Event.RETRY_JOB_ID])
            job_id = str(started["job_id"])
    assert event[Event.RETRY_OUTCOME] == RetryOutcome.QUARANTINED
    assert message(cache_db) == quarantine_message(3, 72)
    assert deployment.run("start_job", **one_per_namespace)["started"] is False
