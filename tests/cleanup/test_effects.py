"""What the deployment does around a finish (``cleanup/effects.py``): counters, the rate limiter, the locks."""

from __future__ import annotations

import datetime as dt

import pytest

from zombie_pipeline.cleanup.effects import DeploymentEffects, Finished
from zombie_pipeline.cleanup.side_collections import SideCollections
from zombie_pipeline.queue.audit_documents import Effect
from zombie_pipeline.queue.blockages import BLOCKAGE_THRESHOLD_SECONDS, BLOCKAGES_COLLECTION, Blockage
from zombie_pipeline.queue.generations import NEWEST_QUEUE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.queue.job_metrics import JOB_METRICS_COLLECTION, JobMetric
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.queue.locks import LOCKS_COLLECTION, Lock
from zombie_pipeline.queue.past_jobs import PAST_JOB_MIN_SECONDS, PastJob
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.queue.worker_type_counts import WorkerSizeMetric, worker_size
from zombie_pipeline.simulation.shapes import job_document

NOW = utc_now()
TODAY = QUEUE_GENERATIONS[NEWEST_QUEUE_GENERATION]
KEPT = QUEUE_GENERATIONS["2023-07"]  # finished jobs kept, with locks and jobTotalMetric


def started(dataset: str, ran_seconds: float, difficulty: int = 50) -> JobDocument:
    return job_document(
        "/splits", dataset, generation=TODAY, difficulty=difficulty, started_at=NOW - dt.timedelta(seconds=ran_seconds)
    )


def effects_of(store, generation=TODAY) -> DeploymentEffects:
    return DeploymentEffects(store, SideCollections.of(store, generation))


@pytest.mark.parametrize(
    ("difficulty", "size"),
    [(0, "light"), (40, "light"), (41, "medium"), (70, "medium"), (71, "heavy"), (None, "heavy")],
)
def test_a_jobs_difficulty_names_the_size_of_the_worker_it_needs(difficulty, size):
    assert worker_size(difficulty) == size


def test_a_finish_moves_the_started_counter_records_a_past_job_and_frees_the_lock(store):
    job = started("alice/a", ran_seconds=45)
    store.locks.insert_one({ID: job[Job.UNICITY_ID], Lock.OWNER: "a-worker", Lock.UPDATED_AT: NOW})

    effects = effects_of(store).after_finish([Finished(job, NOW)], NOW)

    assert effects.by_job == {job[ID]: [Effect.JOB_METRICS, Effect.PAST_JOB, Effect.LOCKS_RELEASED]}
    assert not effects.in_doubt
    [metric] = store.job_metrics.find()
    assert (metric[JobMetric.JOB_TYPE], metric[JobMetric.STATUS], metric[JobMetric.TOTAL]) == (
        "/splits",
        Status.STARTED,
        -1,
    )
    [past] = store.past_jobs.find()
    assert (past[ID], past[PastJob.DATASET], past[PastJob.DURATION]) == (job[ID], "alice/a", 45)
    assert store.locks.find_one()[Lock.OWNER] is None


def test_a_run_shorter_than_30_seconds_leaves_no_past_job(store):
    job = started("alice/a", ran_seconds=PAST_JOB_MIN_SECONDS - 1)

    effects = effects_of(store).after_finish([Finished(job, NOW)], NOW)

    assert Effect.PAST_JOB not in effects.by_job[job[ID]] and store.past_jobs.count_documents({}) == 0


def test_a_dataset_past_its_hourly_limit_is_blocked_once_and_its_pending_jobs_leave_the_worker_counters(store):
    waiting = job_document("/splits", "alice/a", generation=TODAY, status=Status.WAITING, difficulty=20)
    store.jobs.insert_one(waiting)
    store.past_jobs.insert_one(
        {PastJob.DATASET: "alice/a", PastJob.DURATION: BLOCKAGE_THRESHOLD_SECONDS, PastJob.FINISHED_AT: NOW}
    )
    first, second = started("alice/a", 60), started("alice/a", 90)

    effects = effects_of(store).after_finish([Finished(first, NOW), Finished(second, NOW)], NOW)

    assert store.blockages.distinct(Blockage.DATASET) == ["alice/a"]
    assert sum(Effect.BLOCKED_DATASET in done for done in effects.by_job.values()) == 1
    [light] = store.worker_size_metrics.find()
    assert (light[WorkerSizeMetric.WORKER_SIZE], light[WorkerSizeMetric.JOBS_COUNT]) == ("light", -1)


def test_a_finish_found_done_by_an_earlier_pass_never_moves_a_counter_twice(store):
    job = started("alice/a", 45)
    effects = effects_of(store)
    effects.after_finish([Finished(job, NOW)], NOW)

    redone = effects.after_finish([Finished(job, NOW)], NOW, counted=False)

    assert store.job_metrics.find_one()[JobMetric.TOTAL] == -1
    assert redone.in_doubt.job_metrics == {("/splits", Status.STARTED)}  # left to a recount, never moved again
    assert store.past_jobs.count_documents({}) == 1  # keyed by the job: recorded once


def test_where_finished_jobs_are_kept_the_final_status_is_counted_too(store):
    job = started("alice/a", 45)

    store.job_metrics.insert_one({JobMetric.JOB_TYPE: "/splits", JobMetric.STATUS: Status.STARTED, JobMetric.TOTAL: 1})
    effects_of(store, KEPT).after_finish([Finished(job, NOW, Status.ERROR)], NOW)

    totals = {row[JobMetric.STATUS]: row[JobMetric.TOTAL] for row in store.job_metrics.find()}
    assert totals == {Status.STARTED: 0, Status.ERROR: 1}


def test_a_lock_named_by_its_old_owner_field_is_freed_by_that_field(store):
    job = started("alice/a", 45)
    store.locks.insert_one({ID: job[Job.UNICITY_ID], Lock.JOB_ID: "a-worker", Lock.UPDATED_AT: NOW})

    effects_of(store).after_finish([Finished(job, NOW)], NOW)

    lock = store.locks.find_one()
    assert lock[Lock.JOB_ID] is None and Lock.OWNER not in lock  # only the field the document already has


@pytest.mark.parametrize(
    ("generation", "worker_gone", "branch_freed"),
    [
        pytest.param("2023-12", True, True, id="2023-12-dead"),
        pytest.param("2023-12", False, False, id="2023-12-past-its-maximum-duration"),
        pytest.param("2024-06", True, False, id="2024-06-dead"),
    ],
)
def test_where_the_finish_frees_every_lock_a_job_owns_a_dead_jobs_branch_lock_is_freed(
    store, generation, worker_gone, branch_freed
):
    job = started("alice/a", 45)
    branch = "alice/a--refs/convert/parquet"
    store.locks.insert_many(
        [
            {ID: job[Job.UNICITY_ID], Lock.OWNER: "a-worker", Lock.UPDATED_AT: NOW},
            {ID: branch, Lock.OWNER: str(job[ID]), Lock.UPDATED_AT: NOW},
            {ID: "bob/b--refs/convert/parquet", Lock.OWNER: "another-job", Lock.UPDATED_AT: NOW},
        ]
    )

    effects_of(store, QUEUE_GENERATIONS[generation]).after_finish([Finished(job, NOW, worker_gone=worker_gone)], NOW)

    owners = {lock[ID]: lock[Lock.OWNER] for lock in store.locks.find()}
    assert owners[job[Job.UNICITY_ID]] is None
    assert owners[branch] == (None if branch_freed else str(job[ID]))
    assert owners["bob/b--refs/convert/parquet"] == "another-job"


def test_an_insert_counts_the_waiting_jobs_and_their_worker_sizes_unless_their_dataset_is_blocked(store):
    store.blockages.insert_one({Blockage.DATASET: "blocked/b", Blockage.BLOCKED_AT: NOW})
    jobs = [
        job_document("/splits", dataset, generation=TODAY, status=Status.WAITING, difficulty=80)
        for dataset in ("alice/a", "blocked/b")
    ]

    effects_of(store).after_insert(jobs)

    assert store.job_metrics.find_one({JobMetric.STATUS: Status.WAITING})[JobMetric.TOTAL] == 2
    assert {
        row[WorkerSizeMetric.WORKER_SIZE]: row[WorkerSizeMetric.JOBS_COUNT] for row in store.worker_size_metrics.find()
    } == {"heavy": 1}


def test_before_2023_12_only_the_collections_that_exist_are_kept_from_then_on_all_of_the_generations(store):
    store.jobs.database.create_collection(LOCKS_COLLECTION)

    assert SideCollections.of(store, TODAY).kept == TODAY.side_collections
    assert SideCollections.of(store, KEPT).kept == {LOCKS_COLLECTION}
    assert JOB_METRICS_COLLECTION not in SideCollections.of(store, KEPT)
    assert BLOCKAGES_COLLECTION in SideCollections.of(store, TODAY)
