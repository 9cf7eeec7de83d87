"""The core the sensors and checks call: the stale state, the job types, the queue snapshot, what a cleanup left."""

import datetime as dt

from tests.helpers import ago, crashed_job, job_document
from zombie_pipeline.observability import monitoring
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.jobs import Status
from zombie_pipeline.queue.times import utc_now

POLICY = ZombiePolicy()


def test_the_stale_state_depends_on_the_set_of_stale_jobs_only(store):
    jobs = [crashed_job(f"user/{i}") for i in range(3)]
    store.jobs.insert_many(jobs)
    first = monitoring.stale_state(store.jobs, POLICY, utc_now())
    store.jobs.insert_one(job_document(dataset="user/alive", started_at=ago(60), last_heartbeat=ago(10)))
    store.jobs.insert_one(
        job_document(dataset="user/done", status=Status.SUCCESS, started_at=ago(900), finished_at=ago(800))
    )
    assert monitoring.stale_state(store.jobs, POLICY, utc_now() + dt.timedelta(seconds=5)) == first
    assert first.count == 3 and first.run_key.startswith("stale-3-")

    store.jobs.update_one({"_id": jobs[0]["_id"]}, {"$set": {"status": Status.ERROR}})
    assert monitoring.stale_state(store.jobs, POLICY, utc_now()).run_key != first.run_key


def test_no_stale_job_is_a_count_and_nothing_more(store):
    assert monitoring.stale_state(store.jobs, POLICY, utc_now()) == monitoring.StaleState(0)


def test_the_queue_snapshot_counts_what_an_operator_plots(store):
    store.jobs.insert_many(
        [
            crashed_job("user/a"),
            job_document(dataset="user/b", started_at=ago(60), last_heartbeat=ago(10)),
            job_document(status=Status.WAITING),
        ]
    )
    snapshot = monitoring.queue_snapshot(store, POLICY, utc_now())
    assert (snapshot.started, snapshot.waiting, snapshot.stale) == (2, 1, 1)
    assert (snapshot.unfinished_finalizations, snapshot.zombies_finalized_last_24h) == (0, 0)


def test_job_types_are_valid_names_or_refused(store):
    store.jobs.insert_many([job_document(job_type=name) for name in ("/splits", "/first-rows", "a.b", "$where", "")])

    found = monitoring.job_types_in_queue(store.jobs)

    assert found.valid == ("/first-rows", "/splits")
    assert sorted(found.refused) == ["", "$where", "a.b"]
