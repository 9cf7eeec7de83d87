"""Delayed retries: a crashed job's retry waits its backoff in zombieRetries, then the first cleanup after it enqueues it once."""

import datetime as dt
import threading

import pytest

from tests.helpers import Crash, crashed_job, crashing, found, job_document
from zombie_pipeline.cleanup.retries import enqueue_due_retries
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, RetryOutcome, ScheduledRetry, ScheduledState, ZombieEvent
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.trail import pending_retries

DELAYED = ZombiePolicy(retry_delay_seconds=600, retry_jitter=0.0, claim_lease_seconds=0)


def _scheduled_crash(store: Store, policy: ZombiePolicy = DELAYED) -> ZombieEvent:
    """Finalize one crashed job under ``policy``; its event."""
    store.jobs.insert_one(crashed_job())
    run_cleanup(store, policy, "run-1")
    return found(store.events.find_one())


def _waiting(store: Store) -> list[JobDocument]:
    return list(store.jobs.find({Job.STATUS: Status.WAITING}))


def test_the_delay_grows_by_the_factor_per_failed_run_up_to_the_cap_within_the_jitter():
    policy = ZombiePolicy(
        retry_delay_seconds=60, retry_backoff_factor=3, retry_delay_max_seconds=1_000, retry_jitter=0.1
    )
    assert [policy.retry_delay_of(runs) for runs in (1, 2, 3, 4)] == [60, 180, 540, 1_000]
    assert policy.retry_delay_of(2, spread=1.0) == pytest.approx(198) and policy.retry_delay_of(
        2, spread=-1.0
    ) == pytest.approx(162)
    assert ZombiePolicy().retry_delay_of(3) == 0  # the default: at once, as before


def test_a_delayed_retry_is_scheduled_not_enqueued_and_shown_as_pending(store):
    event = _scheduled_crash(store)
    assert event[Event.RETRY_OUTCOME] == RetryOutcome.SCHEDULED
    assert event[Event.RETRY_DUE_AT] - event[Event.FINALIZED_AT] == dt.timedelta(seconds=600)  # no jitter here
    assert _waiting(store) == []
    (scheduled,) = store.retries.find()
    assert (
        scheduled[ScheduledRetry.STATE] == ScheduledState.PENDING
        and scheduled[ScheduledRetry.EVENT_ID] == event[Event.JOB][ID]
    )
    assert pending_retries(store) == 1


def test_a_retry_becomes_due_at_its_time_and_is_enqueued_once(store):
    event = _scheduled_crash(store)
    due_at = event[Event.RETRY_DUE_AT]
    assert enqueue_due_retries(store, DELAYED, due_at - dt.timedelta(seconds=1))["due_retry_enqueued"] == 0
    assert _waiting(store) == []
    report = run_cleanup(store, DELAYED, "run-2", now=due_at + dt.timedelta(seconds=1))
    assert report.reconciled.counts["due_retry_enqueued"] == 1
    (retry,) = _waiting(store)
    assert retry[ID] == event[Event.RETRY_JOB_ID] and retry[Job.DATASET] == event[Event.JOB][Job.DATASET]
    assert store.retries.find_one()[ScheduledRetry.STATE] == ScheduledState.ENQUEUED and pending_retries(store) == 0
    assert (
        run_cleanup(store, DELAYED, "run-3", now=due_at + dt.timedelta(hours=1)).reconciled.counts["due_retry_enqueued"]
        == 0
    )
    assert len(_waiting(store)) == 1


def test_a_due_retry_is_not_enqueued_when_a_twin_already_waits(store):
    event = _scheduled_crash(store)
    store.jobs.insert_one(
        job_document(dataset=event[Event.JOB][Job.DATASET], job_type=event[Event.JOB][Job.TYPE], status=Status.WAITING)
    )
    counts = enqueue_due_retries(store, DELAYED, event[Event.RETRY_DUE_AT])
    assert (counts["due_retry_already_queued"], counts["due_retry_enqueued"]) == (1, 0)
    assert len(_waiting(store)) == 1 and store.jobs.find_one({ID: event[Event.RETRY_JOB_ID]}) is None
    assert store.retries.find_one()[ScheduledRetry.STATE] == ScheduledState.ALREADY_QUEUED


def test_two_cleanups_at_once_enqueue_a_due_retry_once(store):
    event = _scheduled_crash(store)
    due_at = event[Event.RETRY_DUE_AT]
    counts, start = [], threading.Barrier(2)

    def cleanup_run():
        start.wait()
        counts.append(enqueue_due_retries(store, DELAYED, due_at))

    threads = [threading.Thread(target=cleanup_run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(count["due_retry_enqueued"] for count in counts) == 1
    assert [job[ID] for job in _waiting(store)] == [event[Event.RETRY_JOB_ID]]
    assert store.retries.find_one()[ScheduledRetry.STATE] == ScheduledState.ENQUEUED


@pytest.mark.parametrize("writes", range(6))
def test_a_cleanup_dying_anywhere_leaves_the_retry_scheduled_once_and_enqueued_once(store, writes):
    """Killed after ``writes`` writes (finalize, schedule, then enqueue when due): the next runs complete it, once."""
    store.jobs.insert_one(crashed_job())
    with pytest.raises(Crash):
        run_cleanup(crashing(store, writes), DELAYED, "killed")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    run_cleanup(store, DELAYED, "next", now=later)
    assert store.retries.count_documents({}) == 1 and _waiting(store) == []
    due_at = store.retries.find_one()[ScheduledRetry.DUE_AT]
    try:
        enqueue_due_retries(crashing(store, writes), DELAYED, due_at)
    except Crash:
        pass
    run_cleanup(store, DELAYED, "after", now=due_at + dt.timedelta(seconds=1))
    assert len(_waiting(store)) == 1 and store.retries.find_one()[ScheduledRetry.STATE] == ScheduledState.ENQUEUED
