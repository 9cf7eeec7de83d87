"""Reading a period: finished jobs and audited zombies, indexed and projected, folded into per-type tallies."""

from __future__ import annotations

import datetime as dt
import itertools
import zoneinfo
from collections import Counter
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest
from bson import ObjectId
from bson.tz_util import utc as bson_utc

from tests.helpers import logged_store, workload
from tests.statistics.builders import DAY, NEXT_DAY, NOON, UTC, event, job, tally
from zombie_pipeline.cleanup.detection import query_plan_of
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.store import Document
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.statistics.analysis import analyze
from zombie_pipeline.statistics.jobs_source import classify_job, count_undated_jobs, read_period, tally_jobs
from zombie_pipeline.statistics.tallies import BadData, Period, combine, tally_events

# --- reading and statistics --------------------------------------------------------------


def test_statistics_of_known_durations_match_exact_values(store):
    jobs = [job("/a", Status.SUCCESS, seconds) for seconds in range(1, 101)]
    jobs += [job("/a", Status.ERROR, 5.0) for _ in range(7)]
    jobs += [job("/a", Status.CANCELLED, None) for _ in range(3)]  # cancelled while waiting: no duration, not bad
    jobs += [job("/b", Status.SUCCESS, 2.5) for _ in range(4)]
    store.jobs.insert_many(jobs)

    report = analyze(read_period(store.jobs, store.events, DAY, NEXT_DAY), ZombiePolicy())

    a = report.type_report("/a")
    assert a.statuses == {Status.SUCCESS: 100, Status.ERROR: 7, Status.CANCELLED: 3}
    assert a.started == 107
    assert a.statistics == pytest.approx(
        {"count": 100, "mean": 50.5, "p50": 50.5, "p90": 90.1, "p95": 95.05, "p99": 99.01, "max": 100.0}
    )
    b = report.type_report("/b")
    assert b.statistics == pytest.approx(
        {"count": 4, "mean": 2.5, "p50": 2.5, "p90": 2.5, "p95": 2.5, "p99": 2.5, "max": 2.5}
    )
    assert report.bad_data == {}


def test_a_period_holds_the_jobs_finished_from_its_start_up_to_its_end_excluded(store):
    store.jobs.insert_many(
        [
            job("/a", Status.SUCCESS, 10, finished_at=DAY),
            job("/a", Status.SUCCESS, 20, finished_at=NEXT_DAY - dt.timedelta(milliseconds=1)),
            job("/a", Status.SUCCESS, 30, finished_at=NEXT_DAY),
            job("/a", Status.SUCCESS, 40, finished_at=DAY - dt.timedelta(milliseconds=1)),
        ]
    )

    period = read_period(store.jobs, store.events, DAY, NEXT_DAY)

    assert sorted(period.tallies["/a"].success.tolist()) == [10.0, 20.0]


def test_zombies_are_counted_per_reason_with_their_rate_among_started_jobs(store):
    zombies = [
        job("/a", Status.ERROR, 400),
        job("/a", Status.ERROR, 500),
        job("/a", Status.ERROR, 450),
        job("/a", Status.ERROR, 1300),
    ]
    reasons = [
        Reason.MISSING_HEARTBEAT,
        Reason.MISSING_HEARTBEAT,
        Reason.NEVER_HEARTBEATED,
        Reason.EXCEEDED_MAX_DURATION,
    ]
    gone = job("/a", Status.ERROR, 1250)  # its job document expired (TTL); the event remains
    lost = job("/a", Status.ERROR, 600)  # a claim that lost its race: never finalized
    store.jobs.insert_many(zombies + [lost] + [job("/a", Status.SUCCESS, 60) for _ in range(14)])
    store.events.insert_many(
        [event(document, reason) for document, reason in zip(zombies, reasons)]
        + [
            event(gone, Reason.EXCEEDED_MAX_DURATION, EventState.DONE),
            event(lost, Reason.MISSING_HEARTBEAT, EventState.CLAIMED),
        ]
    )

    a = analyze(read_period(store.jobs, store.events, DAY, NEXT_DAY), ZombiePolicy()).type_report("/a")

    assert a.zombies == {Reason.MISSING_HEARTBEAT: 2, Reason.NEVER_HEARTBEATED: 1, Reason.EXCEEDED_MAX_DURATION: 2}
    assert a.started == 14 + 4 + 1 + 1  # successes, zombies, the lost claim's job, the expired job
    assert a.zombie_rate == pytest.approx(5 / 20)
    assert a.statuses == {Status.SUCCESS: 14, Status.ERROR: 6}
    assert a.stopped == 2  # both audited overruns, each counted once


def test_bad_data_is_counted_and_skipped_never_fatal(store):
    good = [job("/a", Status.SUCCESS, 10) for _ in range(5)]
    bad = [
        job("/a", Status.SUCCESS, None),  # missing started_at
        job("/a", Status.SUCCESS, None, **{Job.STARTED_AT: "2024-03-05T11:00:00"}),
        job("/a", Status.SUCCESS, None, **{Job.STARTED_AT: 1709636400}),
        job("/a", Status.SUCCESS, -30),  # finished before started
        job("/a", "exploded", 10),
        {k: v for k, v in job("/a", Status.SUCCESS, 10).items() if k != Job.STATUS},
        job("/a", None, 10),
        job("/a", [Status.SUCCESS], 10),  # an array: the success query returns it
        {k: v for k, v in job("/a", Status.SUCCESS, 10).items() if k != Job.TYPE},
        job("/a", Status.SUCCESS, None, **{Job.FINISHED_AT: "2024-03-05T12:00:00"}),
        {k: v for k, v in job("/a", Status.ERROR, None).items() if k != Job.FINISHED_AT},
    ]
    store.jobs.insert_many(good + bad)
    store.events.insert_one(
        {ID: ObjectId(), Event.REASON: Reason.MISSING_HEARTBEAT, Event.FINALIZED_AT: NOON, Event.STATE: EventState.DONE}
    )

    report = analyze(
        read_period(store.jobs, store.events, DAY, NEXT_DAY), ZombiePolicy(), undated=count_undated_jobs(store.jobs)
    )

    assert report.bad_data == {
        BadData.MISSING_STARTED_AT: 1,
        BadData.STARTED_AT_AS_STRING: 1,
        BadData.STARTED_AT_NOT_A_DATE: 1,
        BadData.FINISHED_BEFORE_STARTED: 1,
        BadData.UNKNOWN_STATUS: 4,
        BadData.INVALID_TYPE: 1,
        BadData.FINISHED_AT_AS_STRING: 1,
        BadData.MISSING_FINISHED_AT: 1,
        BadData.INCOMPLETE_AUDIT_EVENT: 1,
    }
    assert report.type_report("/a").statistics["count"] == 5


def test_days_combined_equal_one_pass_over_the_window(store):
    end = dt.datetime(2024, 3, 8, tzinfo=UTC)
    simulate(
        store,
        workload(finished=600, crashed=0, never_heartbeated=0, overdue=0, running=0, waiting=0, days=3, seed=4),
        now=end,
    )
    audited = [
        job("/first-rows", Status.ERROR, 1300 + 10 * day, finished_at=end - dt.timedelta(days=day, hours=5))
        for day in range(3)
    ]
    store.jobs.insert_many(audited)
    store.events.insert_many([event(document, Reason.EXCEEDED_MAX_DURATION) for document in audited])
    days = [end - dt.timedelta(days=3 - offset) for offset in range(3)]

    combined = combine(
        read_period(store.jobs, store.events, day, day + dt.timedelta(days=1), batch_size=100) for day in days
    )
    one_pass = read_period(store.jobs, store.events, days[0], end)

    assert combined.jobs_read == one_pass.jobs_read > 500
    assert set(combined.tallies) == set(one_pass.tallies)
    for job_type, expected in one_pass.tallies.items():
        got = combined.tallies[job_type]
        assert (got.statuses, got.started, got.zombies) == (expected.statuses, expected.started, expected.zombies)
        for name in ("success", "error", "stopped"):
            assert np.array_equal(np.sort(getattr(got, name)), np.sort(getattr(expected, name))), (job_type, name)
    policy = ZombiePolicy()
    frame = analyze(combined, policy, computed_at=end).statistics_frame()
    assert frame.equals(analyze(one_pass, policy, computed_at=end).statistics_frame())


def test_only_the_needed_fields_leave_the_database_in_batches(mongo_url, store):
    store.jobs.insert_many([job("/a", Status.SUCCESS, seconds, note="x" * 200) for seconds in range(1, 26)])

    with logged_store(mongo_url, store) as (logged, log):
        period = read_period(logged.jobs, logged.events, DAY, NEXT_DAY, batch_size=10)

    assert len(period.tallies["/a"].success) == 25
    finds = [command for command in log.named("find") if command["find"] == store.jobs.name]
    needed = {
        ID,
        Job.TYPE,
        Job.STATUS,
        Job.STARTED_AT,
        Job.FINISHED_AT,
    }  # the status only where the query does not say it
    assert finds and all(
        set(command["projection"]) <= needed and "note" not in command["projection"] for command in finds
    )
    assert all(command.get("batchSize") == 10 for command in finds)
    assert len(log.named("getMore")) >= 2  # 25 documents of one status, 10 a batch


def test_a_day_reads_the_finished_statuses_its_generation_declares_and_examines_only_that_days_jobs(mongo_url, store):
    other_days = [DAY - dt.timedelta(days=2), NEXT_DAY + dt.timedelta(hours=3)]
    store.jobs.insert_many(
        [
            job("/a", status, 5, finished_at=at)
            for status in (Status.SUCCESS, Status.ERROR)
            for at in [NOON] * 6 + other_days * 20
        ]
        + [job("/a", Status.CANCELLED, None) for _ in range(2)]
        + [job("/a", Status.SKIPPED, None)]  # 2023-05 and after declare no such status
        + [job("/a", Status.WAITING, None, **{Job.FINISHED_AT: None}) for _ in range(30)]
        + [job("/a", "exploded", 5) for _ in range(30)]
    )

    with logged_store(mongo_url, store) as (logged, log):
        period = read_period(logged.jobs, logged.events, DAY, NEXT_DAY, generation=QUEUE_GENERATIONS["2023-05"])

    assert log.named("distinct") == []  # which statuses exist is asked once per window, not by every day
    finds = [command for command in log.named("find") if command["find"] == store.jobs.name]
    assert [command["filter"][Job.STATUS] for command in finds] == [Status.CANCELLED, Status.ERROR, Status.SUCCESS]
    examined = []
    for command in finds:
        find = {"find": store.jobs.name, "filter": command["filter"]}
        explained = store.jobs.database.command("explain", find, verbosity="executionStats")
        examined.append(query_plan_of(explained)["executionStats"]["totalDocsExamined"])
    assert examined == [2, 6, 6] and period.jobs_read == 14
    assert (
        period.tallies["/a"].statuses == {Status.SUCCESS: 6, Status.ERROR: 6, Status.CANCELLED: 2}
        and period.bad_data == {}
    )


def test_jobs_of_a_status_the_generation_does_not_declare_are_counted_once_over_the_whole_collection(store):
    long_ago = DAY - dt.timedelta(days=400)
    store.jobs.insert_many(
        [
            job("/a", Status.SUCCESS, 5),
            job("/a", Status.WAITING, None, **{Job.FINISHED_AT: None}),
            job("/a", Status.STARTED, 5),
        ]
        + [job("/a", "exploded", 5), job("/a", "exploded", 5, finished_at=long_ago)]
        + [without(job("/a", "running", 5), Job.FINISHED_AT)]
        + [
            job("/a", None, 5),
            without(job("/a", Status.SUCCESS, 5), Job.STATUS),
            job("/a", 3, 5),
            job("/a", {"name": "x"}, 5),
        ]
        + [job("/a", ["exploded", "running"], 5)]  # one job, though it holds two odd statuses
        + [job("/a", Status.SKIPPED, None), job("/a", Status.SKIPPED, None, finished_at=long_ago)]
    )

    newest, oldest = QUEUE_GENERATIONS["2023-05"], QUEUE_GENERATIONS["2023-01"]  # only the oldest declares skipped

    assert count_undated_jobs(store.jobs, newest) == {BadData.UNKNOWN_STATUS: 10}
    assert count_undated_jobs(store.jobs, oldest) == {BadData.UNKNOWN_STATUS: 8}
    assert read_period(store.jobs, store.events, DAY, NEXT_DAY, generation=oldest).tallies["/a"].statuses == {
        Status.SUCCESS: 1,
        Status.SKIPPED: 1,
    }
    assert read_period(store.jobs, store.events, DAY, NEXT_DAY, generation=newest).bad_data == {}  # counted once: above


# --- a batch classified on arrays, as one document at a time ------------------------------


def without(document: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key != name}


def every_kind_of_job() -> list[Mapping[str, Any]]:
    """Good jobs of two types, jobs that never started, and each kind of bad job data, interleaved."""
    good: list[Mapping[str, Any]] = [job("/a", Status.SUCCESS, seconds) for seconds in (1, 2.5, 3600, 0)]
    good += [job("/b", Status.ERROR, 7), job("/a", Status.ERROR, 0.001), job("/b", Status.SUCCESS, 86_400 * 3)]
    good += [job("/a", Status.CANCELLED, None), job("/b", Status.SKIPPED, None), job("/a", Status.CANCELLED, 12)]
    good += [without(job("/b", Status.CANCELLED, None), Job.FINISHED_AT)]  # never started: its end does not matter
    bad = [
        job("/a", Status.SUCCESS, None),  # missing started_at
        job("/a", Status.ERROR, None, **{Job.STARTED_AT: None}),
        job("/a", Status.SUCCESS, None, **{Job.STARTED_AT: "2024-03-05T11:00:00"}),
        job("/a", Status.SUCCESS, None, **{Job.STARTED_AT: 1709636400}),
        job("/a", Status.SUCCESS, None, **{Job.STARTED_AT: [NOON]}),
        job("/a", Status.SUCCESS, -30),  # finished before started
        job("/a", "exploded", 10),
        job("/a", None, 10),
        job("/a", [Status.SUCCESS], 10),  # an array matches the status query
        job("/a", Status.STARTED, 10),
        without(job("/a", Status.SUCCESS, 10), Job.STATUS),
        without(job("/a", Status.SUCCESS, 10), Job.TYPE),
        job("", Status.SUCCESS, 10),
        job(None, Status.ERROR, 10),
        job(["/a"], Status.SUCCESS, 10),
        job(7, Status.SUCCESS, 10),
        job("/a", Status.SUCCESS, None, **{Job.STARTED_AT: NOON, Job.FINISHED_AT: "2024-03-05T12:00:00"}),
        without(job("/a", Status.ERROR, 10), Job.FINISHED_AT),
    ]
    return [document for pair in itertools.zip_longest(good, bad) for document in pair if document is not None]


def one_by_one(documents: list[Mapping[str, Any]]) -> tuple[dict[str, Any], Counter[str]]:
    """The tallies and bad data as classify_job makes them, a document at a time: the rule the batches follow."""
    tallies: dict[str, tuple[Counter[str], list[float], list[float], list[float]]] = {}
    bad_data: Counter[str] = Counter()
    for document in documents:
        outcome = classify_job(document)
        if isinstance(outcome, str):
            bad_data[outcome] += 1
            continue
        job_type, status, seconds = outcome
        statuses, started, success, error = tallies.setdefault(job_type, (Counter(), [], [], []))
        statuses[status] += 1
        if seconds is not None:
            started.append(seconds)
            by_status: dict[str, list[float]] = {Status.SUCCESS: success, Status.ERROR: error}
            by_status.get(status, []).append(seconds)
    return {
        # np.float32 of a list is a float32 array; numpy's stubs type it for a scalar only
        job_type: (dict(statuses), len(started), np.float32(success).tolist(), np.float32(error).tolist())  # type: ignore[arg-type]
        for job_type, (statuses, started, success, error) in tallies.items()
    }, bad_data


def batched(documents: list[Mapping[str, Any]], batch_size: int) -> tuple[dict[str, Any], Counter[Any]]:
    period = tally_jobs(Period(start=DAY, end=NEXT_DAY), documents, batch_size=batch_size)
    assert all(
        tally.success.dtype == np.float32 and tally.error.dtype == np.float32 for tally in period.tallies.values()
    )
    return {
        job_type: (dict(tally.statuses), tally.started, tally.success.tolist(), tally.error.tolist())
        for job_type, tally in period.tallies.items()
    }, period.bad_data


@pytest.mark.parametrize("batch_size", [1, 4, 1000])
def test_a_batch_of_every_kind_of_job_is_tallied_as_each_job_alone(batch_size):
    documents = every_kind_of_job()

    tallies, bad_data = batched(documents, batch_size)

    assert (tallies, bad_data) == one_by_one(documents)
    not_of_jobs = {
        BadData.INCOMPLETE_AUDIT_EVENT,
        BadData.MISSING_DURATION,
        BadData.INVALID_DURATION,
        BadData.INVALID_HTTP_STATUS,
    }
    assert set(bad_data) == {kind for name, kind in vars(BadData).items() if name.isupper()} - not_of_jobs
    assert tallies["/a"][0] == {Status.SUCCESS: 4, Status.ERROR: 1, Status.CANCELLED: 2}


def test_durations_are_utc_whatever_the_zone_of_the_dates():
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    summer_time = dt.datetime(2024, 3, 31, 1, 30, tzinfo=UTC)  # 02:00 in Paris became 03:00 at 01:00 UTC

    def pair(job_type, started, finished):
        return {**job(job_type, Status.SUCCESS, None), Job.STARTED_AT: started, Job.FINISHED_AT: finished}

    start, end = NOON - dt.timedelta(seconds=90), NOON
    documents = [
        pair("/utc", start, end),
        pair("/naive", start.replace(tzinfo=None), end.replace(tzinfo=None)),  # read as UTC
        pair("/offsets", start.astimezone(dt.timezone(dt.timedelta(hours=-5))), end.astimezone(bson_utc)),
        pair(
            "/naive-and-aware", start.replace(tzinfo=None), end
        ),  # each alone is fine; the pair is not subtractable in Python
        pair("/timestamp", pd.Timestamp(start), end),
        pair("/paris", (summer_time - dt.timedelta(hours=1)).astimezone(paris), summer_time.astimezone(paris)),
    ]

    for batch_size in (1, 2, 100):  # alone, in pairs, together
        tallies, bad_data = batched(documents, batch_size)
        assert (tallies, bad_data) == one_by_one(documents)
    assert tallies["/paris"][2] == [3600.0]  # one hour of UTC, two on the wall clock
    assert all(
        tallies[job_type][2] == [90.0] for job_type in ("/utc", "/naive", "/offsets", "/naive-and-aware", "/timestamp")
    )


def test_an_audited_job_in_a_batch_counts_once_and_a_bad_one_counts_as_gone():
    successes = [job("/a", Status.SUCCESS, 60) for _ in range(3)]
    overrun, crashed = job("/a", Status.ERROR, 1300), job("/a", Status.ERROR, 400)
    backwards = job("/a", Status.ERROR, -5)  # bad data: its event is all that counts
    events = [event(overrun, Reason.EXCEEDED_MAX_DURATION), event(crashed, Reason.MISSING_HEARTBEAT)]
    events += [{**event(job("/a", Status.ERROR, 50), Reason.NEVER_HEARTBEATED), ID: backwards[ID]}]

    period = Period(start=DAY, end=NEXT_DAY)
    tally_jobs(period, successes + [backwards, overrun, crashed], tally_events(period, events), batch_size=2)

    a = period.tallies["/a"]
    assert (a.statuses, a.started) == ({Status.SUCCESS: 3, Status.ERROR: 3}, 6)
    assert (a.success.tolist(), a.error.tolist(), a.stopped.tolist()) == ([60.0] * 3, [], [1300.0])
    assert a.zombies == {Reason.EXCEEDED_MAX_DURATION: 1, Reason.MISSING_HEARTBEAT: 1, Reason.NEVER_HEARTBEATED: 1}
    assert period.bad_data == {BadData.FINISHED_BEFORE_STARTED: 1}


def test_a_crash_audited_long_past_its_t2_is_not_a_run_stopped_at_t2(store):
    """A worker that died is not a job stopped at its limit: no censoring, no backtest, no "stopped" from crashes."""
    successes = [job("/a", Status.SUCCESS, 60) for _ in range(200)]
    crashed = [job("/a", Status.ERROR, 5_000) for _ in range(10)]  # dead for over an hour before the cleanup saw them
    overrun = job("/a", Status.ERROR, 1_300)
    store.jobs.insert_many(successes + crashed + [overrun])
    store.events.insert_many(
        [event(document, Reason.MISSING_HEARTBEAT) for document in crashed]
        + [event(overrun, Reason.EXCEEDED_MAX_DURATION)]
    )

    report = analyze(read_period(store.jobs, store.events, DAY, NEXT_DAY), ZombiePolicy(max_duration_seconds=1_200))

    a = report.type_report("/a")
    assert (a.started, a.statuses) == (211, {Status.SUCCESS: 200, Status.ERROR: 11})
    assert a.zombies == {Reason.MISSING_HEARTBEAT: 10, Reason.EXCEEDED_MAX_DURATION: 1}
    assert a.stopped == 1 and not a.censored  # the one overrun: 1 of 201 runs, under the 1 % of the p99 rule
    assert a.stopped_durations.tolist() == [1_300.0]


def test_combining_many_periods_joins_each_type_in_order():
    days = [Period(start=DAY + dt.timedelta(days=day), end=DAY + dt.timedelta(days=day + 1)) for day in range(30)]
    for day, period in enumerate(days):
        period.tallies["/a"] = tally([float(day)], stopped=[day + 0.5])

    a = combine(reversed(days)).tallies["/a"]

    assert a.success.tolist() == [float(day) for day in range(30)]
    assert a.stopped.tolist() == [day + 0.5 for day in range(30)]
    assert (a.statuses, a.started) == ({Status.SUCCESS: 30, Status.ERROR: 30}, 60)


def test_detection_times_are_tallied_per_reason_and_days_tallied_before_they_were_recorded_still_combine():
    crashed = [event(job("/a", Status.ERROR, 900), Reason.MISSING_HEARTBEAT) for _ in range(3)]
    for seconds, audited in zip((310.0, 320.5, 500.0), crashed):
        audited[Event.DETECTION_SECONDS] = seconds
    unrecorded = event(job("/a", Status.ERROR, 900), Reason.NEVER_HEARTBEATED)  # finalized before 2026-12
    today = Period(start=NEXT_DAY, end=NEXT_DAY + dt.timedelta(days=1))
    tally_events(today, [*crashed, unrecorded])
    yesterday = Period(start=DAY, end=NEXT_DAY)
    del yesterday.__dict__["detection"]  # a day tallied (and stored) by an earlier version

    window = combine([yesterday, today])

    assert {reason: times.tolist() for reason, times in window.detection.items()} == {
        Reason.MISSING_HEARTBEAT: [310.0, 320.5, 500.0]
    }
    assert window.tallies["/a"].zombies == {Reason.MISSING_HEARTBEAT: 3, Reason.NEVER_HEARTBEATED: 1}


def test_a_clean_status_is_read_into_columns_and_one_holding_a_string_date_falls_back_to_documents(mongo_url, store):
    good = [job("/a", Status.SUCCESS, seconds) for seconds in range(1, 11)] + [job("/a", Status.ERROR, 5)]
    bad = cast(Document, job("/a", Status.ERROR, 7))
    bad[Job.STARTED_AT] = bad[Job.STARTED_AT].isoformat()  # a date stored as a string
    store.jobs.insert_many(good + [bad])

    with logged_store(mongo_url, store) as (logged, log):
        period = read_period(logged.jobs, logged.events, DAY, NEXT_DAY)

    assert len(period.tallies["/a"].success) == 10 and period.tallies["/a"].statuses[Status.ERROR] == 1
    assert period.bad_data == {BadData.STARTED_AT_AS_STRING: 1}
    finds = {
        command["filter"][Job.STATUS]: command for command in log.named("find") if command["find"] == store.jobs.name
    }
    assert Job.STATUS not in finds[Status.SUCCESS]["projection"]  # decoded into columns: the status is the query's
    error_finds = [
        command for command in log.named("find") if command.get("filter", {}).get(Job.STATUS) == Status.ERROR
    ]
    assert len(error_finds) == 2 and Job.STATUS in error_finds[1]["projection"]  # then read again as documents
