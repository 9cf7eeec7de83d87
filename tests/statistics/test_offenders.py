"""Repeat offenders counted on crafted audit events, on the real server."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest
from bson import ObjectId

from tests.helpers import job_document
from zombie_pipeline.cleanup.detection import query_plan_of
from zombie_pipeline.messages import ERROR_MESSAGE_OF_REASON
from zombie_pipeline.queue.audit_documents import Event, EventState, FreeRuns, RetryOutcome
from zombie_pipeline.queue.cache import ErrorCode
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.reasons import ERROR_CODE_OF_REASON, Cause, Reason
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.statistics.offenders import (
    ErrorSource,
    Problem,
    find_offenders,
    offenders_pipeline,
)
from zombie_pipeline.statistics.reports import offenders_markdown

UTC = dt.UTC
START, END = dt.datetime(2024, 3, 8, tzinfo=UTC), dt.datetime(2024, 3, 11, tzinfo=UTC)  # three days


def at(day: int, hour: int = 12, minute: int = 0) -> dt.datetime:
    return dt.datetime(2024, 3, day, hour, minute, tzinfo=UTC)


def event(dataset, job_type, reason, finalized_at, state=EventState.DONE, **fields) -> dict:
    """An audit event as the cleanup writes it, with only the fields the offenders read unless told otherwise."""
    job = {Job.TYPE: job_type, Job.DATASET: dataset} if dataset is not None else {Job.TYPE: job_type}
    document = {
        ID: ObjectId(),
        Event.JOB: job,
        Event.REASON: reason,
        Event.FINALIZED_AT: finalized_at,
        Event.STATE: state,
        Event.RETRY_OUTCOME: RetryOutcome.ENQUEUED,
        **fields,
    }
    if reason in ERROR_CODE_OF_REASON:
        document.setdefault(Event.ERROR_CODE, ERROR_CODE_OF_REASON[reason])
    return document


CRASHED_MESSAGE = ERROR_MESSAGE_OF_REASON[Reason.MISSING_HEARTBEAT]


@pytest.fixture
def crafted(store):
    """Three days of finalizations: two datasets over the threshold of 3, one under it, noise around them."""
    store.events.insert_many(
        [
            # user/big: 4 on /splits over three days, 1 on /first-rows that reached its retry limit
            event("user/big", "/splits", Reason.MISSING_HEARTBEAT, at(8, 1)),
            event("user/big", "/splits", Reason.MISSING_HEARTBEAT, at(8, 7)),
            event("user/big", "/splits", Reason.NEVER_HEARTBEATED, at(9)),
            event("user/big", "/splits", Reason.TERMINATED, at(10, 20)),
            event(
                "user/big",
                "/first-rows",
                Reason.EXCEEDED_MAX_DURATION,
                at(10, 8),
                **{Event.RETRY_OUTCOME: RetryOutcome.LIMIT_REACHED},
            ),
            # user/exact: exactly the threshold, one a day
            event("user/exact", "/parquet", Reason.MISSING_HEARTBEAT, at(8)),
            event("user/exact", "/parquet", Reason.MISSING_HEARTBEAT, at(9)),
            event("user/exact", "/parquet", Reason.MISSING_HEARTBEAT, at(10, 23, 59)),
            # user/under: two in the window, one more whose type is not a name, two just outside, one still claimed
            event("user/under", "/splits", Reason.MISSING_HEARTBEAT, at(9)),
            event("user/under", "/splits", Reason.TERMINATED, at(10)),
            event("user/under", "$where", Reason.MISSING_HEARTBEAT, at(10)),
            event("user/under", "/splits", Reason.MISSING_HEARTBEAT, START - dt.timedelta(milliseconds=1)),
            event("user/under", "/splits", Reason.MISSING_HEARTBEAT, END),
            event("user/under", "/splits", Reason.MISSING_HEARTBEAT, at(9), state=EventState.CLAIMED),
            # malformed: no dataset, a dataset that is a number, a reason nobody wrote
            event(None, "/splits", Reason.MISSING_HEARTBEAT, at(9)),
            event(42, "/splits", Reason.MISSING_HEARTBEAT, at(9)),
            event("user/big", "/splits", "eaten_by_a_grue", at(9)),
            {ID: ObjectId(), Event.JOB: "not a document", Event.FINALIZED_AT: at(9), Event.STATE: EventState.DONE},
        ]
    )
    big_splits = job_document("/splits", "user/big", config="default", split="train")
    store.cache.insert_many(
        [
            # two error entries of user/big's /splits: the newer one is its last error
            cache_document(
                big_splits, at(9), http_status=501, error_code=ErrorCode.CRASHED, content={"error": CRASHED_MESSAGE}
            ),
            cache_document(
                job_document("/splits", "user/big", config="other", split="test"),
                at(7),
                http_status=500,
                error_code="SplitsNamesError",
                content={"error": "an older error"},
            ),
            # user/exact's /parquet succeeded since: no error entry, its last error is the events'
            cache_document(job_document("/parquet", "user/exact"), at(11)),
            # another kind of user/exact in error: not one of its offending types
            cache_document(
                job_document("/croissant", "user/exact"), at(9), http_status=500, error_code="CroissantError"
            ),
        ]
    )
    return store


def test_offenders_are_counted_exactly_on_crafted_events_across_days(crafted):
    found = find_offenders(crafted, START, END, threshold=3)

    assert [offender.dataset for offender in found.offenders] == ["user/big", "user/exact"]
    assert (found.offenders_total, found.events, found.datasets) == (2, 10, 3)
    assert found.malformed == Counter(
        {Problem.INVALID_DATASET: 3, Problem.UNKNOWN_REASON: 1, Problem.INVALID_JOB_TYPE: 1}
    )
    assert found.skipped == 5 and not found.truncated

    big, exact = found.offenders
    assert big.finalizations == 5
    assert big.reasons == Counter(
        {
            Reason.MISSING_HEARTBEAT: 2,
            Reason.NEVER_HEARTBEATED: 1,
            Reason.TERMINATED: 1,
            Reason.EXCEEDED_MAX_DURATION: 1,
        }
    )
    assert (big.first_seen, big.last_seen, big.retry_limit_reached) == (at(8, 1), at(10, 20), True)
    splits, first_rows = big.offenses
    assert (splits.job_type, splits.finalizations, splits.first_seen, splits.last_seen) == (
        "/splits",
        4,
        at(8, 1),
        at(10, 20),
    )
    assert splits.reasons == Counter({Reason.MISSING_HEARTBEAT: 2, Reason.NEVER_HEARTBEATED: 1, Reason.TERMINATED: 1})
    assert not splits.retry_limit_reached
    assert (splits.last_error_code, splits.last_error_message, splits.last_error_source) == (
        ErrorCode.CRASHED,
        CRASHED_MESSAGE,
        ErrorSource.CACHE,
    )
    assert (first_rows.job_type, first_rows.finalizations, first_rows.retry_limit_reached) == ("/first-rows", 1, True)
    assert (first_rows.last_error_code, first_rows.last_error_message, first_rows.last_error_source) == (
        ErrorCode.EXCEEDED_MAX_DURATION,
        None,
        ErrorSource.EVENT,
    )
    assert big.latest is splits  # the dataset's last error is its last finalization's

    assert exact.finalizations == 3 and exact.reasons == Counter({Reason.MISSING_HEARTBEAT: 3})
    assert (exact.first_seen, exact.last_seen, exact.retry_limit_reached) == (at(8), at(10, 23, 59), False)
    [parquet] = exact.offenses
    assert (parquet.last_error_code, parquet.last_error_source) == (ErrorCode.CRASHED, ErrorSource.EVENT)


def test_the_rows_and_the_job_types_of_the_offenders_are_plain_values(crafted):
    found = find_offenders(crafted, START, END, threshold=3)

    rows = found.rows()
    assert [(row["dataset"], row["type"], row["finalizations"]) for row in rows] == [
        ("user/big", "/splits", 4),
        ("user/big", "/first-rows", 1),
        ("user/exact", "/parquet", 3),
    ]
    assert rows[0] == {
        "dataset": "user/big",
        "type": "/splits",
        "finalizations": 4,
        "missing_heartbeat": 2,
        "never_heartbeated": 1,
        "terminated": 1,
        "exceeded_max_duration": 0,
        "first_seen": "2024-03-08 01:00:00",
        "last_seen": "2024-03-10 20:00:00",
        "retry_limit_reached": False,
        "last_error": "JobManagerCrashedError",
        "last_error_message": CRASHED_MESSAGE,
        "error_from": "cache",
        "quarantined": False,
    }
    by_type = found.by_job_type()
    assert list(by_type) == ["/splits", "/parquet", "/first-rows"]
    assert by_type["/parquet"] == {
        "datasets": 1,
        "finalizations": 3,
        "reasons": Counter({Reason.MISSING_HEARTBEAT: 3}),
        "retry_limit_reached": 0,
    }
    assert by_type["/first-rows"]["retry_limit_reached"] == 1


def test_the_threshold_decides_who_is_an_offender(crafted):
    assert [o.dataset for o in find_offenders(crafted, START, END, threshold=2).offenders] == [
        "user/big",
        "user/exact",
        "user/under",
    ]
    assert [o.dataset for o in find_offenders(crafted, START, END, threshold=4).offenders] == ["user/big"]
    assert find_offenders(crafted, START, END, threshold=6).offenders_total == 0


def test_a_narrower_window_counts_only_its_own_days(crafted):
    found = find_offenders(crafted, at(9, 0), at(10, 0), threshold=1)
    assert {offender.dataset: offender.finalizations for offender in found.offenders} == {
        "user/big": 1,
        "user/exact": 1,
        "user/under": 1,
    }
    assert found.malformed == Counter({Problem.INVALID_DATASET: 3, Problem.UNKNOWN_REASON: 1})


def test_the_limit_keeps_the_most_finalized_and_counts_the_rest(crafted):
    found = find_offenders(crafted, START, END, threshold=3, limit=1)
    assert [offender.dataset for offender in found.offenders] == ["user/big"]
    assert found.offenders_total == 2 and found.truncated

    counted = find_offenders(crafted, START, END, threshold=3, limit=0)
    assert counted.offenders == [] and counted.offenders_total == 2


def test_a_window_without_events_has_no_offenders(store):
    found = find_offenders(store, START, END)
    assert (found.offenders, found.offenders_total, found.events, found.datasets, found.skipped) == ([], 0, 0, 0, 0)


@pytest.mark.parametrize(
    "start, end, threshold, limit",
    [(END, START, 3, 10), (START, START, 3, 10), (START, END, 0, 10), (START, END, 3, -1)],
)
def test_a_window_backwards_or_a_threshold_below_one_is_refused(store, start, end, threshold, limit):
    with pytest.raises(ValueError):
        find_offenders(store, start, end, threshold=threshold, limit=limit)


def test_the_window_is_read_on_the_finalized_at_index(crafted):
    explained = crafted.events.database.command(
        "explain",
        {"aggregate": crafted.events.name, "pipeline": offenders_pipeline(START, END), "cursor": {}},
        verbosity="executionStats",
    )
    plan = query_plan_of(explained)
    assert "IXSCAN" in str(plan["queryPlanner"]["winningPlan"])  # never a scan of the whole audit trail
    assert plan["executionStats"]["totalDocsExamined"] <= 16  # the window's events, not those around it


def test_the_reports_section_lists_each_offending_type_and_what_was_skipped(crafted):
    section = offenders_markdown(find_offenders(crafted, START, END, threshold=3), max_rows=2)

    lines = section.splitlines()
    assert lines[0] == (
        "**Repeat offenders 2024-03-08 00:00 – 2024-03-11 00:00 UTC**: 2 datasets finalized at least 3 times "
        "(10 finalizations of 3 datasets in the window)."
    )
    assert (
        "| `user/big` | `/splits` | 4 (2 / 1 / 1 / 0) | 2024-03-08 01:00:00 | 2024-03-10 20:00:00 | no | JobManagerCrashedError (cache) |"
        in lines
    )
    assert (
        "| `user/big` | `/first-rows` | 1 (0 / 0 / 0 / 1) | 2024-03-10 08:00:00 | 2024-03-10 08:00:00 | yes | JobManagerExceededMaximumDurationError (event) |"
        in lines
    )
    assert "Not listed: 1 more rows." in lines
    assert lines[-1] == "Skipped events: invalid_dataset 3, invalid_job_type 1, unknown_reason 1."


def test_a_window_without_offenders_says_so_in_one_line(store):
    assert offenders_markdown(find_offenders(store, START, END)) == (
        "**Repeat offenders 2024-03-08 00:00 – 2024-03-11 00:00 UTC**: 0 datasets finalized at least 3 times "
        "(0 finalizations of 0 datasets in the window).\n"
    )


def _lone_sigterm(dataset: str, finalized_at: dt.datetime, free: int, charged: bool) -> dict:
    """A lone SIGTERM's event: free within its pair's 3 free re-runs, or charged as a crash past them."""
    budget = {
        FreeRuns.ALONE: free + charged,
        FreeRuns.FREE: free,
        FreeRuns.LIMIT: 3,
        FreeRuns.WINDOW_HOURS: 72,
        FreeRuns.CHARGED: charged,
    }
    cause = Cause.CRASH if charged else Cause.DEPLOY
    return event(dataset, "/splits", Reason.TERMINATED, finalized_at, **{Event.CAUSE: cause, Event.FREE_RUNS: budget})


def test_the_pairs_that_used_up_their_free_re_runs_are_listed_beside_the_quarantines(store):
    store.events.insert_many(
        [_lone_sigterm("user/evicted", at(8, hour), free, False) for hour, free in ((1, 1), (5, 2), (9, 3))]
        + [_lone_sigterm("user/evicted", at(9, hour), 3, True) for hour in (1, 5)]
        + [_lone_sigterm("user/once", at(9, hour), free, False) for hour, free in ((1, 1), (2, 2))]
    )

    found = find_offenders(store, START, END)

    assert found.free_runs_spent == [
        {
            "dataset": "user/evicted",
            "type": "/splits",
            "terminated_alone": 5,
            "charged": 2,
            "free_limit": 3,
            "window_hours": 72,
            "last": "2024-03-09 05:00:00",
        }
    ]  # user/once used two of its three: not listed
    section = offenders_markdown(found)
    assert "**Free re-runs used up**: 1 (dataset, job type) pairs" in section
    assert "| `user/evicted` | `/splits` | 5 | 2 | 3 in 72 h | 2024-03-09 05:00:00 |" in section
    assert find_offenders(store, at(8, 0), at(8, 6)).free_runs_spent == []  # two free ones then: none used up
