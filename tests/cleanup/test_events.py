"""The write-ahead log (``cleanup/events.py``): an exclusive claim, leases taken over only once expired, outcomes recorded."""

from __future__ import annotations

from typing import cast

from bson import ObjectId

from tests.helpers import QUEUE_GENERATION, ago, crashed_job, find, logged_store
from zombie_pipeline.cleanup.events import EventLog
from zombie_pipeline.cleanup.results import Count
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState, ZombieEvent
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID
from zombie_pipeline.queue.times import utc_now

POLICY = ZombiePolicy(claim_lease_seconds=300)
GENERATION = QUEUE_GENERATIONS[QUEUE_GENERATION]


def log_of(store, run_id: str, policy: ZombiePolicy = POLICY) -> EventLog:
    return EventLog(store.events, run_id, policy)


def claimed(store, run_id: str, zombies: int = 3):
    store.jobs.insert_many([crashed_job(f"user/z-{i}") for i in range(zombies)])
    candidates = find(store, POLICY).candidates
    return candidates, log_of(store, run_id).claim(candidates, utc_now(), GENERATION, finalized_at=utc_now())


def test_a_claim_is_an_event_per_candidate_keyed_by_its_job_with_the_job_as_detection_saw_it(store):
    candidates, result = claimed(store, "run-a")

    assert result.counts == {Count.CLAIMED: 3}
    for candidate in candidates:
        event = store.events.find_one({ID: candidate.id})
        assert event[Event.JOB] == candidate.job and event[Event.REASON] == candidate.reason
        assert (event[Event.STATE], event[Event.LEASE_OWNER], event[Event.QUEUE_GENERATION]) == (
            EventState.CLAIMED,
            "run-a",
            GENERATION.name,
        )
        assert event[Event.RETRY_JOB_ID] != candidate.id  # chosen now, so that a redone pass inserts the same retry
        # how late the finalization comes, from the job's last sign of life (crashed_job: its last heartbeat)
        assert event[Event.DETECTION_SECONDS] == candidate.detection_seconds(event[Event.FINALIZED_AT]) > 300


def test_a_job_already_claimed_by_another_cleanup_is_left_to_it(store):
    candidates, _ = claimed(store, "run-a")

    second = log_of(store, "run-b").claim(candidates, utc_now(), GENERATION, finalized_at=utc_now())

    assert second.counts == {Count.CLAIMED: 0, Count.CLAIMED_BY_ANOTHER_CLEANUP: 3}
    assert set(store.events.distinct(Event.LEASE_OWNER)) == {"run-a"}
    assert second.ids == set()


def test_a_claim_the_run_inserted_before_its_reply_was_lost_is_its_own_but_not_fresh(store):
    """The step retried after its claim's reply was lost finds its own events: claimed, not another cleanup's, and
    not among the fresh ones (an earlier attempt may have done part of their pass)."""
    candidates, first = claimed(store, "run-a")

    again = log_of(store, "run-a").claim(candidates, utc_now(), GENERATION, finalized_at=utc_now())

    assert first.ids == {candidate.id for candidate in candidates}
    assert again.counts == {Count.CLAIMED: 3}
    assert again.ids == set()


def test_only_events_whose_lease_ran_out_are_taken_over(store):
    claimed(store, "dead-run")
    store.events.update_one({}, {"$set": {Event.LEASE_UNTIL: ago(1)}})  # one lease ran out; two still run

    taken = log_of(store, "next-run").take_over_expired(utc_now())

    assert taken == 1
    assert sorted(store.events.distinct(Event.LEASE_OWNER)) == ["dead-run", "next-run"]
    assert store.events.find_one({Event.LEASE_OWNER: "next-run"})[Event.LEASE_UNTIL] > utc_now()


def test_an_event_written_before_generations_were_recorded_is_taken_over_as_the_oldest(store):
    claimed(store, "dead-run", zombies=1)
    store.events.update_one({}, {"$unset": {Event.QUEUE_GENERATION: ""}, "$set": {Event.LEASE_UNTIL: ago(1)}})

    log_of(store, "next-run").take_over_expired(utc_now())

    assert store.events.find_one()[Event.QUEUE_GENERATION] == QUEUE_GENERATIONS[QUEUE_GENERATION].name


def test_a_step_drains_its_own_events_by_batch_until_none_is_left(store):
    claimed(store, "run-a", zombies=5)
    small = ZombiePolicy(batch_size=2)
    seen = []

    for batch in log_of(store, "run-a", small).drain({Event.STATE: EventState.CLAIMED}):
        seen.append(len(batch))
        store.events.update_many(
            {ID: {"$in": [event[ID] for event in batch]}}, {"$set": {Event.STATE: EventState.DONE}}
        )

    assert seen == [2, 2, 1]
    assert list(log_of(store, "another-run", small).drain({})) == []  # another run's events are not its own


def test_outcomes_are_recorded_in_one_command_one_update_per_distinct_outcome(store, mongo_url):
    candidates, _ = claimed(store, "run-a", zombies=4)
    ids = [candidate.id for candidate in candidates]
    # "x" is no field of an event: only how the changes are grouped into updates matters here
    changes = cast(
        dict[ObjectId, ZombieEvent], {ids[0]: {"x": 1}, ids[1]: {"x": 1}, ids[2]: {"x": 2}, ids[3]: {"x": [1, 2]}}
    )  # a list: its own update

    with logged_store(mongo_url, store) as (logged, log):
        log_of(logged, "run-a").complete(changes, forgotten=(), session=None)

    [update] = [command for command in log.commands if "updates" in command]
    assert len(update["updates"]) == 3
    assert {event[ID]: event["x"] for event in store.events.find()} == {ids[0]: 1, ids[1]: 1, ids[2]: 2, ids[3]: [1, 2]}


def test_an_outcome_is_never_recorded_on_an_event_another_run_drives(store):
    candidates, _ = claimed(store, "run-a", zombies=1)

    log_of(store, "run-b").complete({candidates[0].id: {Event.STATE: EventState.DONE}}, forgotten=(), session=None)

    assert store.events.find_one()[Event.STATE] == EventState.CLAIMED


def test_a_claim_lost_to_a_worker_is_forgotten_with_the_outcomes_recorded(store):
    candidates, _ = claimed(store, "run-a", zombies=2)
    done, lost = candidates[0].id, candidates[1].id

    log_of(store, "run-a").complete({done: {Event.STATE: EventState.DONE}}, forgotten=[lost], session=None)

    assert [(event[ID], event[Event.STATE]) for event in store.events.find()] == [(done, EventState.DONE)]
