"""Duration statistics and T2 suggestions: reading a period, the statistics, each suggestion rule, the backtest."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import zoneinfo
from collections import Counter

import numpy as np
import pytest
import pandas as pd
from bson import ObjectId
from bson.tz_util import utc as bson_utc
from pymongo import MongoClient, monitoring

from zombie_pipeline.documents import (
    DEFAULT_SUGGESTIONS_COLLECTION,
    ID,
    Event,
    EventState,
    Job,
    Reason,
    Status,
    T2Suggestion,
)
from zombie_pipeline.durations import (
    BadData,
    Period,
    SuggestionRules,
    Tally,
    analyze,
    analyze_window,
    binomial_cdf,
    classify_job,
    combine,
    count_undated_jobs,
    latest_suggested_max_durations,
    policy_with_suggestions,
    quantile_interval,
    read_period,
    readable_round_up,
    save_suggestions,
    suggest,
    tally_events,
    tally_jobs,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.simulate import Workload, simulate

UTC = dt.timezone.utc
DAY = dt.datetime(2024, 3, 5, tzinfo=UTC)
NEXT_DAY = DAY + dt.timedelta(days=1)
NOON = DAY + dt.timedelta(hours=12)


def job(job_type: str, status: str, seconds: float | None, finished_at: dt.datetime = NOON, **fields) -> dict:
    """A finished job that ran ``seconds`` (None: never started)."""
    document = {ID: ObjectId(), Job.TYPE: job_type, Job.STATUS: status, Job.FINISHED_AT: finished_at}
    if seconds is not None:
        document[Job.STARTED_AT] = finished_at - dt.timedelta(seconds=seconds)
    document.update(fields)
    return document


def event(job_document: dict, reason: str, state: str = EventState.DONE) -> dict:
    """The audit event of a zombie finalization; its finalized_at is the job's finished_at."""
    return {
        ID: job_document[ID],
        Event.JOB: {Job.TYPE: job_document[Job.TYPE], Job.STARTED_AT: job_document[Job.STARTED_AT]},
        Event.REASON: reason,
        Event.FINALIZED_AT: job_document[Job.FINISHED_AT],
        Event.STATE: state,
    }


def tally(success=(), error=(), stopped=()) -> Tally:
    return Tally(
        statuses={Status.SUCCESS: len(success), Status.ERROR: len(error) + len(stopped)},
        started=len(success) + len(error) + len(stopped),
        success=np.asarray(success, dtype=np.float32),
        error=np.asarray(error, dtype=np.float32),
        stopped=np.asarray(stopped, dtype=np.float32),
    )


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
    assert b.statistics == pytest.approx({"count": 4, "mean": 2.5, "p50": 2.5, "p90": 2.5, "p95": 2.5, "p99": 2.5, "max": 2.5})
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
    reasons = [Reason.MISSING_HEARTBEAT, Reason.MISSING_HEARTBEAT, Reason.NEVER_HEARTBEATED, Reason.EXCEEDED_MAX_DURATION]
    gone = job("/a", Status.ERROR, 1250)  # its job document expired (TTL); the event remains
    lost = job("/a", Status.ERROR, 600)  # a claim that lost its race: never finalized
    store.jobs.insert_many(zombies + [lost] + [job("/a", Status.SUCCESS, 60) for _ in range(14)])
    store.events.insert_many(
        [event(document, reason) for document, reason in zip(zombies, reasons)]
        + [event(gone, Reason.EXCEEDED_MAX_DURATION, EventState.FINALIZED), event(lost, Reason.MISSING_HEARTBEAT, EventState.CLAIMED)]
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
    store.events.insert_one({ID: ObjectId(), Event.REASON: Reason.MISSING_HEARTBEAT, Event.FINALIZED_AT: NOON, Event.STATE: EventState.DONE})

    report = analyze(
        read_period(store.jobs, store.events, DAY, NEXT_DAY), ZombiePolicy(), undated=count_undated_jobs(store.jobs)
    )

    assert report.bad_data == {
        BadData.MISSING_STARTED_AT: 1,
        BadData.STARTED_AT_AS_STRING: 1,
        BadData.STARTED_AT_NOT_A_DATE: 1,
        BadData.FINISHED_BEFORE_STARTED: 1,
        BadData.UNKNOWN_STATUS: 4,
        BadData.MISSING_TYPE: 1,
        BadData.FINISHED_AT_AS_STRING: 1,
        BadData.MISSING_FINISHED_AT: 1,
        BadData.INCOMPLETE_AUDIT_EVENT: 1,
    }
    assert report.type_report("/a").statistics["count"] == 5


def test_days_combined_equal_one_pass_over_the_window(store):
    end = dt.datetime(2024, 3, 8, tzinfo=UTC)
    simulate(
        store.jobs.database,
        store.cache.database,
        Workload(finished=600, crashed=0, never_heartbeated=0, overdue=0, running=0, waiting=0, days=3, seed=4),
        now=end,
    )
    audited = [job("/first-rows", Status.ERROR, 1300 + 10 * day, finished_at=end - dt.timedelta(days=day, hours=5)) for day in range(3)]
    store.jobs.insert_many(audited)
    store.events.insert_many([event(document, Reason.EXCEEDED_MAX_DURATION) for document in audited])
    days = [end - dt.timedelta(days=3 - offset) for offset in range(3)]

    combined = combine(read_period(store.jobs, store.events, day, day + dt.timedelta(days=1), batch_size=100) for day in days)
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

    class Listener(monitoring.CommandListener):
        commands: list = []

        def started(self, event):
            self.commands.append(event.command)

        def succeeded(self, event):
            pass

        def failed(self, event):
            pass

    listener = Listener()
    client = MongoClient(mongo_url, event_listeners=[listener], tz_aware=True)
    try:
        database = client[store.jobs.database.name]
        period = read_period(database[store.jobs.name], database[store.events.name], DAY, NEXT_DAY, batch_size=10)
    finally:
        client.close()

    assert len(period.tallies["/a"].success) == 25
    finds = [command for command in listener.commands if command.get("find") == store.jobs.name]
    assert finds and all(set(command["projection"]) == {ID, Job.TYPE, Job.STATUS, Job.STARTED_AT, Job.FINISHED_AT} for command in finds)
    assert all(command.get("batchSize") == 10 for command in finds)
    assert sum(1 for command in listener.commands if "getMore" in command) >= 2  # 25 documents of one status, 10 a batch


# --- a batch classified on arrays, as one document at a time ------------------------------


def without(document: dict, name: str) -> dict:
    return {key: value for key, value in document.items() if key != name}


def every_kind_of_job() -> list[dict]:
    """Good jobs of two types, jobs that never started, and each kind of bad job data, interleaved."""
    good = [job("/a", Status.SUCCESS, seconds) for seconds in (1, 2.5, 3600, 0)]
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


def one_by_one(documents: list[dict]) -> tuple[dict, Counter]:
    """The tallies and bad data as classify_job makes them, a document at a time: the rule the batches follow."""
    tallies, bad_data = {}, Counter()
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
            {Status.SUCCESS: success, Status.ERROR: error}.get(status, []).append(seconds)
    return {
        job_type: (dict(statuses), len(started), np.float32(success).tolist(), np.float32(error).tolist())
        for job_type, (statuses, started, success, error) in tallies.items()
    }, bad_data


def batched(documents: list[dict], batch_size: int) -> tuple[dict, Counter]:
    period = tally_jobs(Period(start=DAY, end=NEXT_DAY), documents, batch_size=batch_size)
    assert all(tally.success.dtype == np.float32 and tally.error.dtype == np.float32 for tally in period.tallies.values())
    return {
        job_type: (dict(tally.statuses), tally.started, tally.success.tolist(), tally.error.tolist())
        for job_type, tally in period.tallies.items()
    }, period.bad_data


@pytest.mark.parametrize("batch_size", [1, 4, 1000])
def test_a_batch_of_every_kind_of_job_is_tallied_as_each_job_alone(batch_size):
    documents = every_kind_of_job()

    tallies, bad_data = batched(documents, batch_size)

    assert (tallies, bad_data) == one_by_one(documents)
    assert set(bad_data) == {kind for name, kind in vars(BadData).items() if name.isupper()} - {BadData.INCOMPLETE_AUDIT_EVENT}
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
        pair("/naive-and-aware", start.replace(tzinfo=None), end),  # each alone is fine; the pair is not subtractable in Python
        pair("/timestamp", pd.Timestamp(start), end),
        pair("/paris", (summer_time - dt.timedelta(hours=1)).astimezone(paris), summer_time.astimezone(paris)),
    ]

    for batch_size in (1, 2, 100):  # alone, in pairs, together
        tallies, bad_data = batched(documents, batch_size)
        assert (tallies, bad_data) == one_by_one(documents)
    assert tallies["/paris"][2] == [3600.0]  # one hour of UTC, two on the wall clock
    assert all(tallies[job_type][2] == [90.0] for job_type in ("/utc", "/naive", "/offsets", "/naive-and-aware", "/timestamp"))


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
    assert (a.success.tolist(), a.error.tolist(), a.stopped.tolist()) == ([60.0] * 3, [400.0], [1300.0])
    assert a.zombies == {Reason.EXCEEDED_MAX_DURATION: 1, Reason.MISSING_HEARTBEAT: 1, Reason.NEVER_HEARTBEATED: 1}
    assert period.bad_data == {BadData.FINISHED_BEFORE_STARTED: 1}


@pytest.mark.parametrize("n", [1, 30, 299, 300, 5_000, 200_000])
@pytest.mark.parametrize("quantile", [0.5, 0.99])
def test_the_quantile_interval_reads_only_likely_counts_and_agrees_with_the_whole_binomial_law(n, quantile):
    cdf = binomial_cdf(n, quantile)[:n]  # every count
    low, high = np.nonzero(cdf <= 0.025)[0], np.nonzero(cdf >= 0.975)[0]

    assert quantile_interval(np.arange(n, dtype=np.float64), quantile, 0.95) == (
        float(low[-1]) if len(low) else None,
        float(high[0]) if len(high) else None,
    )


def test_combining_many_periods_joins_each_type_in_order():
    days = [
        Period(start=DAY + dt.timedelta(days=day), end=DAY + dt.timedelta(days=day + 1))
        for day in range(30)
    ]
    for day, period in enumerate(days):
        period.tallies["/a"] = tally([float(day)], stopped=[day + 0.5])

    a = combine(reversed(days)).tallies["/a"]

    assert a.success.tolist() == [float(day) for day in range(30)]
    assert a.stopped.tolist() == [day + 0.5 for day in range(30)]
    assert (a.statuses, a.started) == ({Status.SUCCESS: 30, Status.ERROR: 30}, 60)


# --- suggestion rules ---------------------------------------------------------------------


def test_the_suggestion_is_the_quantile_times_the_margin_rounded_up():
    durations = list(range(1, 1001))  # p99 = 990.01 s, p90 = 900.1 s

    assert suggest("/a", tally(durations), 1200, 300).suggested_t2_seconds == 1500  # 1485.0 s -> 25 min
    assert suggest("/a", tally(durations), 1200, 300, SuggestionRules(quantile=0.9)).suggested_t2_seconds == 1380  # 1350.2 s -> 23 min
    assert suggest("/a", tally(durations), 1200, 300, SuggestionRules(margin=2.0)).suggested_t2_seconds == 2100  # 1980.0 s -> 35 min
    report = suggest("/a", tally(durations), 1200, 300)
    assert report.quantile_seconds == pytest.approx(990.01)
    assert report.change == "raise"


@pytest.mark.parametrize(
    ("seconds", "readable"),
    [
        (1, 30),
        (299.5, 300),
        (600, 600),
        (601, 660),
        (1200, 1200),
        (1200.0001, 1260),
        (1801, 2100),
        (7199, 7200),
        (7201, 8100),
        (43_201, 46_800),
    ],
)
def test_readable_rounding_goes_up_to_the_next_step_of_its_magnitude(seconds, readable):
    assert readable_round_up(seconds) == readable
    assert readable >= seconds and readable <= max(seconds * 1.17, 30)


def test_the_suggestion_never_goes_below_the_heartbeat_timeout():
    report = suggest("/fast", tally([2.0] * 100), 1200, 300)

    assert report.suggested_t2_seconds == 300
    assert report.change == "lower"
    assert any("heartbeat" in flag for flag in report.flags)


def test_a_type_with_fewer_than_min_samples_keeps_its_current_t2():
    too_few = suggest("/rare", tally([5.0] * 29), 1800, 300)
    enough = suggest("/rare", tally([5.0] * 30), 1800, 300)

    assert (too_few.enough_data, too_few.suggested_t2_seconds, too_few.change) == (False, 1800, "keep")
    assert any("not enough data" in flag for flag in too_few.flags)
    assert (enough.enough_data, enough.suggested_t2_seconds) == (True, 300)
    assert suggest("/rare", tally([5.0] * 29), 1800, 300, SuggestionRules(min_samples=10)).enough_data


def test_many_jobs_stopped_make_the_suggestion_a_lower_bound_that_never_lowers_t2():
    successes = [float(value) for value in range(1, 201)]  # p99 199.01 s -> 300 s floor

    few = suggest("/a", tally(successes, error=[1200.0]), 1200, 300)  # 1 of 201 stopped: 0.5 % < 1 %
    many = suggest("/a", tally(successes, error=[1200.0, 1250.0], stopped=[1300.0]), 1200, 300)  # 3 of 203
    audited_only = suggest("/a", tally(successes, stopped=[1300.0, 1400.0, 1500.0]), 1200, 300)

    assert not few.censored and few.suggested_t2_seconds == 300
    assert many.censored and many.stopped == 3 and many.stopped_share == pytest.approx(3 / 203)
    assert many.suggested_t2_seconds == 1200
    assert any("lower bound" in flag and "raise T2 and measure again" in flag for flag in many.flags)
    assert audited_only.censored
    assert suggest("/a", tally(successes, error=[1200.0]), 1200, 300, SuggestionRules(censored_fraction=0.004)).censored


def test_errors_shorter_than_the_current_t2_are_not_counted_as_stopped():
    report = suggest("/a", tally([10.0] * 100, error=[30.0] * 50 + [1199.0]), 1200, 300)

    assert report.stopped == 0 and not report.censored


def test_the_quantile_interval_comes_from_order_statistics():
    durations = np.arange(1, 101, dtype=np.float32)

    assert quantile_interval(durations, 0.5, 0.95) == (40.0, 61.0)  # the textbook X(40), X(61) for n = 100
    assert quantile_interval(np.arange(1, 31, dtype=np.float32), 0.99, 0.95) == (28.0, None)  # no upper bound yet
    assert quantile_interval(np.empty(0, dtype=np.float32), 0.99) == (None, None)
    low, high = quantile_interval(np.arange(1, 1001, dtype=np.float32), 0.99, 0.95)
    assert low < 990.01 < high


def test_binomial_cdf_matches_exact_sums():
    n, p = 20, 0.3
    exact = np.cumsum([math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)])

    assert binomial_cdf(n, p) == pytest.approx(exact, abs=1e-12)


def test_suggestion_rules_refuse_out_of_range_settings():
    for bad in ({"quantile": 1.0}, {"quantile": 0.2}, {"margin": 0.9}, {"min_samples": 0}, {"confidence": 1.0}, {"censored_fraction": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SuggestionRules(**bad)


# --- backtest -------------------------------------------------------------------------------


def test_backtest_counts_successes_the_suggestion_would_kill_and_how_much_sooner_overruns_stop():
    successes = [float(value) for value in range(10, 1001, 10)]  # p90 = 901 s -> 960 s with margin 1
    rules = SuggestionRules(quantile=0.9, margin=1.0)

    report = suggest("/a", tally(successes, error=[30.0, 1200.0, 1500.0]), 1200, 300, rules)

    assert report.suggested_t2_seconds == 960
    assert report.backtest_successes_stopped == 4  # 970, 980, 990, 1000 s
    assert report.backtest_successes_stopped_share == pytest.approx(0.04)
    assert report.backtest_stopped_sooner == 2
    assert report.backtest_seconds_saved == pytest.approx((1200 - 960) + (1500 - 960))
    assert report.backtest_given_more_time == 0


def test_backtest_counts_stopped_jobs_a_higher_t2_would_have_let_run():
    successes = [float(value) for value in range(10, 1001, 10)]
    rules = SuggestionRules(quantile=0.9, margin=1.0)

    report = suggest("/a", tally(successes, error=[600.0, 700.0, 1500.0]), 600, 300, rules)

    assert (report.suggested_t2_seconds, report.change) == (960, "raise")
    assert report.stopped == 3
    assert report.backtest_given_more_time == 2
    assert (report.backtest_stopped_sooner, report.backtest_seconds_saved) == (1, pytest.approx(540.0))


# --- the report and the suggestions collection -------------------------------------------


def _period(tallies: dict[str, Tally], end: dt.datetime = NEXT_DAY) -> Period:
    return Period(start=end - dt.timedelta(days=7), end=end, tallies=tallies)


def test_types_configured_in_the_policy_appear_even_without_jobs():
    policy = ZombiePolicy(max_duration_seconds_by_type={"/unseen": 3600})

    report = analyze(_period({"/a": tally([10.0] * 50)}), policy)

    assert [entry.job_type for entry in report.types] == ["/a", "/unseen"]
    unseen = report.type_report("/unseen")
    assert (unseen.enough_data, unseen.suggested_t2_seconds, unseen.statistics["count"]) == (False, 3600, 0)
    assert report.suggested_max_durations() == {"/a": 300}
    assert report.policy_max_durations() == {"/a": 300, "/unseen": 3600}


def test_latest_suggested_max_durations_come_from_the_newest_window_and_only_with_enough_data(queue_db):
    collection = queue_db[DEFAULT_SUGGESTIONS_COLLECTION]
    assert latest_suggested_max_durations(collection) == {}
    policy = ZombiePolicy()
    newer = analyze(_period({"/a": tally([100.0] * 50), "/rare": tally([5.0] * 3)}, NEXT_DAY), policy)
    older = analyze(_period({"/a": tally([1000.0] * 50)}, DAY), policy)

    save_suggestions(collection, newer)
    save_suggestions(collection, older)  # a backfill of an older window
    save_suggestions(collection, newer)  # recomputing a window replaces its document

    assert collection.count_documents({}) == 2
    assert latest_suggested_max_durations(collection) == {"/a": 300}
    assert latest_suggested_max_durations(collection, minimum_seconds=600) == {"/a": 600}
    stored = collection.find_one({ID: NEXT_DAY})
    assert {entry[T2Suggestion.TYPE]: entry[T2Suggestion.ENOUGH_DATA] for entry in stored[T2Suggestion.BY_TYPE]} == {
        "/a": True,
        "/rare": False,
    }


def test_a_policy_with_suggestions_takes_the_suggested_t2_of_each_type_and_keeps_the_others(queue_db):
    collection = queue_db[DEFAULT_SUGGESTIONS_COLLECTION]
    policy = ZombiePolicy(max_duration_seconds_by_type={"/a": 3600, "/b": 2400})
    assert policy_with_suggestions(policy, collection) is policy  # nothing suggested yet
    save_suggestions(collection, analyze(_period({"/a": tally([100.0] * 50), "/c": tally([400.0] * 50)}), policy))

    in_force = policy_with_suggestions(policy, collection)

    assert in_force.max_duration_seconds_by_type == {"/a": 300, "/b": 2400, "/c": 600}
    assert policy_with_suggestions(ZombiePolicy(heartbeat_timeout_seconds=450), collection).max_duration_of("/a") == 450


def test_analyze_window_reads_the_days_before_its_end(store):
    store.jobs.insert_many(
        [job("/a", Status.SUCCESS, 100, finished_at=NOON - dt.timedelta(days=days)) for days in (0, 1, 6, 8)]
    )

    report = analyze_window(store.jobs, store.events, ZombiePolicy(), end=NEXT_DAY, window_days=7)

    assert report.type_report("/a").statistics["count"] == 3
    assert report.window_start == NEXT_DAY - dt.timedelta(days=7)
