"""The audit trail, read (``trail.py``): each question answered from what the collections hold, and an event this
code did not write skipped where it is counted."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from zombie_pipeline import trail
from zombie_pipeline.queue.audit_documents import CompensationState, Event, EventState
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.reasons import Cause, Reason
from zombie_pipeline.queue.times import utc_now

NOW = utc_now()
HOUR = dt.timedelta(hours=1)


def event(
    name: str, state: str = EventState.DONE, finalized_at: dt.datetime = NOW - HOUR, fields: Mapping[str, Any] = {}
) -> dict[str, Any]:
    return {ID: name, Event.STATE: state, Event.FINALIZED_AT: finalized_at, **fields}


def test_the_finalized_events_of_a_window_are_those_done_within_it(store):
    store.events.insert_many(
        [
            event("done-in"),
            event("claimed-in", EventState.CLAIMED),
            event("done-at-end", finalized_at=NOW),
            event("done-before", finalized_at=NOW - 48 * HOUR),
        ]
    )

    found = trail.finalized_events(store.events, NOW - 24 * HOUR, NOW, {ID: 1})

    assert sorted(document[ID] for document in found) == ["done-in"]


def test_unfinished_finalizations_are_the_events_not_done(store):
    store.events.insert_many([event("done"), event("claimed", EventState.CLAIMED), event("other", "finalized")])

    assert trail.unfinished_finalizations(store) == 2


def test_a_runs_finalizations_are_the_events_it_drove_to_done_oldest_first(store):
    store.events.insert_many(
        [
            event("later", fields={Event.LEASE_OWNER: "run-a"}),
            event("earlier", finalized_at=NOW - 2 * HOUR, fields={Event.LEASE_OWNER: "run-a"}),
            event("claimed", EventState.CLAIMED, fields={Event.LEASE_OWNER: "run-a"}),
            event("another-runs", fields={Event.LEASE_OWNER: "run-b"}),
        ]
    )

    assert [document[ID] for document in trail.finalized_by_run(store, "run-a")] == ["earlier", "later"]


def test_an_event_this_code_did_not_write_is_counted_under_no_cause(store):
    job = {Job.TYPE: "/first-rows"}
    store.events.insert_many(
        [
            event("crash", fields={Event.JOB: job, Event.REASON: Reason.MISSING_HEARTBEAT, Event.CAUSE: Cause.CRASH}),
            event("older-than-causes", fields={Event.JOB: job, Event.REASON: Reason.TERMINATED}),
            event("unknown-reason", fields={Event.JOB: job, Event.REASON: "gone_fishing"}),
            event("no-type", fields={Event.JOB: {}, Event.REASON: Reason.MISSING_HEARTBEAT}),
        ]
    )

    assert trail.causes_between(store, NOW - 24 * HOUR, NOW) == {"/first-rows": {Cause.CRASH: 1, Cause.DEPLOY: 1}}


def test_finalizations_since_a_moment_count_those_begun_then_completed_or_not(store):
    store.events.insert_many(
        [event("done"), event("claimed", EventState.CLAIMED), event("yesterday", finalized_at=NOW - 30 * HOUR)]
    )

    assert trail.finalizations_since(store, NOW - 24 * HOUR) == 2


def test_compensations_are_counted_by_their_state(store):
    store.events.insert_many(
        [
            event("pending", fields={Event.COMPENSATION_STATE: CompensationState.PENDING}),
            event("failed", fields={Event.COMPENSATION_STATE: CompensationState.FAILED}),
            event("also-failed", fields={Event.COMPENSATION_STATE: CompensationState.FAILED}),
            event("none"),
        ]
    )

    assert trail.compensations_in(store, CompensationState.PENDING) == 1
    assert trail.compensations_in(store, CompensationState.FAILED) == 2
