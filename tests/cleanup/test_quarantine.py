"""A (dataset, job type) whose workers keep crashing is quarantined (``cleanup/quarantine.py``): its entry, its lift by
an operator, its lapse, at the early-2023 queue (finished jobs kept as ``error``, the cleanup re-enqueues crashes) and
today's (deleted; the deployment's backfill re-runs crashes while their failed runs are below its limit)."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.cleanup.test_causes import NOW, deployment, entry_of, waiting
from tests.faults.scenario import counters_off
from tests.helpers import Crash, cleanup_at, crashing, found
from zombie_pipeline.cleanup.quarantine import NotQuarantined, lift
from zombie_pipeline.messages import quarantine_message
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, Quarantine, RetryOutcome, ZombieEvent
from zombie_pipeline.queue.cache import CACHE_CONTENT_ERROR, CACHE_METRICS_COLLECTION, Cache
from zombie_pipeline.queue.cache_entries import DETAIL_QUARANTINED, stored_failed_runs
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.queue.reasons import Cause
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import truncate_ms
from zombie_pipeline.simulation.shapes import job_document
from zombie_pipeline.trail import active_quarantines

BOTH = pytest.mark.parametrize("generation", ["2023-01", "2026-05"])
POISON = "user/poison"
TYPE = "/first-rows"
HOUR = dt.timedelta(hours=1)


def crash(
    store: Store, policy: ZombiePolicy, generation: str, at: dt.datetime, split: str = "train", **fields: object
) -> ZombieEvent:
    """A worker running POISON's TYPE of ``split`` dies 10 minutes before ``at``, and the cleanup of ``at`` finalizes
    it: the waiting retry of an earlier crash is the job that ran, where there is one; else a new job (the backfill's)."""
    retry = store.jobs.find_one({Job.DATASET: POISON, Job.SPLIT: split, Job.STATUS: Status.WAITING})
    started_at, last_heartbeat = (
        truncate_ms(at - 15 * dt.timedelta(minutes=1)),
        truncate_ms(at - 10 * dt.timedelta(minutes=1)),
    )
    if retry is not None:
        store.jobs.update_one(
            {ID: retry[ID]},
            {"$set": {Job.STATUS: Status.STARTED, Job.STARTED_AT: started_at, Job.LAST_HEARTBEAT: last_heartbeat}},
        )
        job_id = retry[ID]
    else:
        job = job_document(
            TYPE,
            POISON,
            "default",
            split,
            generation=generation,
            started_at=started_at,
            last_heartbeat=last_heartbeat,
            **fields,  # type: ignore[arg-type]
        )
        store.jobs.insert_one(job)
        job_id = job[ID]
    cleanup_at(store, policy, at, run_id=f"run-{at:%d%H%M}")
    return found(store.events.find_one({ID: job_id}))


def _quarantined_by_three_crashes(store: Store, policy: ZombiePolicy, generation: str) -> list[ZombieEvent]:
    return [crash(store, policy, generation, NOW + offset * HOUR) for offset in (0, 20, 40)]


def poison_waiting(store: Store) -> list[JobDocument]:
    return [job for job in waiting(store) if job[Job.DATASET] == POISON]


@BOTH
def test_a_third_crash_within_72_hours_quarantines_the_dataset_and_job_type(store, generation):
    policy = deployment(store, generation)
    first, second, third = _quarantined_by_three_crashes(store, policy, generation)

    assert [event[Event.CAUSE] for event in (first, second, third)] == [Cause.CRASH] * 3
    assert third[Event.RETRY_OUTCOME] == RetryOutcome.QUARANTINED and poison_waiting(store) == []
    kept = QUEUE_GENERATIONS[generation].keeps_finished_jobs
    assert first[Event.RETRY_OUTCOME] == (RetryOutcome.ENQUEUED if kept else RetryOutcome.NOT_RETRIED)
    (quarantine,) = store.quarantine.find()
    assert (quarantine[Quarantine.DATASET], quarantine[Quarantine.JOB_TYPE], quarantine[Quarantine.CRASHES]) == (
        POISON,
        TYPE,
        3,
    )
    assert quarantine[Quarantine.EVENT_IDS] == [first[ID], second[ID], third[ID]]
    assert quarantine[Quarantine.LAPSES_AT] - quarantine[Quarantine.SINCE] == policy.quarantine_lapse_hours * HOUR
    entry = entry_of(store, POISON)
    assert entry[Cache.CONTENT] == {CACHE_CONTENT_ERROR: quarantine_message(3, 72)}
    assert entry[Cache.DETAILS][DETAIL_QUARANTINED] is True
    assert [found(q) for q in active_quarantines(store, NOW + 41 * HOUR)] == [quarantine]


def test_where_the_backfill_counts_failed_runs_a_quarantined_entry_is_at_its_limit(store):
    """Three splits crashing once each: their failed runs are 1, but the third entry records the deployment's limit
    (3) so that its backfill does not re-run it."""
    policy = deployment(store, "2026-05")
    events = [crash(store, policy, "2026-05", NOW + offset * HOUR, split=split) for offset, split in enumerate("abc")]
    assert [event[Event.RETRY_OUTCOME] for event in events] == [RetryOutcome.NOT_RETRIED] * 2 + [
        RetryOutcome.QUARANTINED
    ]
    failed_runs = {entry[Cache.SPLIT]: stored_failed_runs(entry) for entry in store.cache.find({Cache.DATASET: POISON})}
    assert failed_runs == {"a": 1, "b": 1, "c": 3}


@BOTH
def test_crashes_further_apart_than_the_window_never_quarantine(store, generation):
    policy = deployment(store, generation)
    events = [crash(store, policy, generation, NOW + offset * HOUR) for offset in (0, 40, 80)]
    assert events[-1][Event.RETRY_OUTCOME] != RetryOutcome.QUARANTINED
    assert store.quarantine.count_documents({}) == 0


def test_deploy_deaths_do_not_count_towards_a_quarantine(store):
    policy = deployment(store, "2026-05")
    crash(store, policy, "2026-05", NOW)
    sigterm = truncate_ms(NOW + 20 * HOUR - 12 * dt.timedelta(minutes=1))
    deploy = crash(store, policy, "2026-05", NOW + 20 * HOUR, terminated_at=sigterm)
    last = crash(store, policy, "2026-05", NOW + 40 * HOUR)
    assert deploy[Event.CAUSE] == Cause.DEPLOY and deploy[Event.RETRY_OUTCOME] == RetryOutcome.ENQUEUED
    assert last[Event.RETRY_OUTCOME] == RetryOutcome.NOT_RETRIED and store.quarantine.count_documents({}) == 0


def test_nothing_of_a_quarantined_pair_is_re_enqueued_whatever_its_cause(store):
    policy = deployment(store, "2026-05")
    _quarantined_by_three_crashes(store, policy, "2026-05")
    sigterm = truncate_ms(NOW + 50 * HOUR - 12 * dt.timedelta(minutes=1))
    deploy = crash(store, policy, "2026-05", NOW + 50 * HOUR, split="test", terminated_at=sigterm)
    assert (deploy[Event.CAUSE], deploy[Event.RETRY_OUTCOME]) == (Cause.DEPLOY, RetryOutcome.QUARANTINED)
    assert poison_waiting(store) == [] and store.quarantine.count_documents({}) == 1


@BOTH
def test_a_lifted_quarantine_reruns_the_withheld_job_and_counts_crashes_afresh(store, generation):
    policy = deployment(store, generation)
    *_, third = _quarantined_by_three_crashes(store, policy, generation)
    lifted_at = NOW + 41 * HOUR

    lifted = lift(store, policy, POISON, TYPE, "lift-run", lifted_at)

    assert (lifted.scheduled, lifted.counts["due_retry_enqueued"]) == (1, 1)
    (rerun,) = poison_waiting(store)
    assert rerun[ID] == third[Event.RETRY_JOB_ID] and rerun[Job.UNICITY_ID] == third[Event.JOB][Job.UNICITY_ID]
    off = counters_off(store, QUEUE_GENERATIONS[generation])
    assert not any(count for name, count in off.items() if name != CACHE_METRICS_COLLECTION)
    quarantine = found(store.quarantine.find_one())
    assert (quarantine[Quarantine.LIFTED_AT], quarantine[Quarantine.LIFTED_BY]) == (lifted_at, "lift-run")
    assert active_quarantines(store, lifted_at) == []
    with pytest.raises(NotQuarantined, match=r"its quarantine has ended\); quarantined now: none"):
        lift(store, policy, POISON, TYPE, "again", lifted_at)
    # the re-run crashes again: the first crash after the lift, retried as crashes are
    after = crash(store, policy, generation, NOW + 42 * HOUR)
    assert after[Event.RETRY_OUTCOME] != RetryOutcome.QUARANTINED


@BOTH
def test_a_quarantine_lapses_after_its_hours_and_the_next_crash_is_retried(store, generation):
    policy = deployment(store, generation, quarantine_lapse_hours=24)
    *_, third = _quarantined_by_three_crashes(store, policy, generation)
    lapse = third[Event.FINALIZED_AT] + 24 * HOUR
    assert len(active_quarantines(store, lapse - dt.timedelta(seconds=1))) == 1
    assert active_quarantines(store, lapse) == []

    # within 72 h of the first two, but after the lapse; another split (the first one's is past its retry limit)
    after = crash(store, policy, generation, NOW + 66 * HOUR, split="test")

    kept = QUEUE_GENERATIONS[generation].keeps_finished_jobs
    assert after[Event.RETRY_OUTCOME] == (RetryOutcome.ENQUEUED if kept else RetryOutcome.NOT_RETRIED)


def test_lifting_a_pair_that_is_not_quarantined_is_refused_naming_the_ones_that_are(store):
    policy = deployment(store, "2026-05")
    _quarantined_by_three_crashes(store, policy, "2026-05")
    with pytest.raises(
        NotQuarantined,
        match=r"user/other /first-rows is not quarantined; quarantined now: \['user/poison /first-rows'\]",
    ):
        lift(store, policy, "user/other", TYPE, "lift-run", NOW + 41 * HOUR)
    with pytest.raises(NotQuarantined, match="cannot lift a quarantine: dataset starts with"):
        lift(store, policy, "$where", TYPE, "lift-run", NOW + 41 * HOUR)
    assert store.quarantine.count_documents({Quarantine.LIFTED_AT: None}) == 1


@pytest.mark.parametrize("writes", range(5))
def test_a_cleanup_killed_anywhere_in_the_quarantining_pass_is_completed_as_one_quarantine(store, writes):
    """Killed after ``writes`` writes (the claim, the quarantine, the cache entry, its counter, the deletion): the next
    run takes the claim over and decides the same."""
    policy = deployment(store, "2026-05", claim_lease_seconds=0)
    crash(store, policy, "2026-05", NOW)
    crash(store, policy, "2026-05", NOW + 20 * HOUR)
    at = NOW + 40 * HOUR
    job = job_document(
        TYPE,
        POISON,
        "default",
        "train",
        generation="2026-05",
        started_at=at - 15 * dt.timedelta(minutes=1),
        last_heartbeat=at - 10 * dt.timedelta(minutes=1),
    )
    store.jobs.insert_one(job)
    with pytest.raises(Crash):
        cleanup_at(crashing(store, writes), policy, at, run_id="killed")

    cleanup_at(store, policy, at + dt.timedelta(minutes=1), run_id="next")

    event = found(store.events.find_one({ID: job[ID]}))
    assert event[Event.RETRY_OUTCOME] == RetryOutcome.QUARANTINED
    (quarantine,) = store.quarantine.find()
    assert quarantine[Quarantine.CRASHES] == 3 and quarantine[Quarantine.EVENT_ID] == job[ID]
    assert entry_of(store, POISON)[Cache.CONTENT] == {CACHE_CONTENT_ERROR: quarantine_message(3, 72)}
    assert stored_failed_runs(entry_of(store, POISON)) == 3
