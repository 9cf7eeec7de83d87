"""The pipeline's metrics: named as Prometheus wants them, and each figure what the databases or the report hold."""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter

import pytest
from bson import ObjectId
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import ago, crashed_job, healthy_job, job_document, report_suggesting
from zombie_pipeline import trail
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.observability import metrics
from zombie_pipeline.observability.monitoring import QueueSnapshot
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState, RetryOutcome
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.reasons import CAUSES, CAUSES_OF_REASON, REASONS
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.statistics.gap_histogram import GapHistogram
from zombie_pipeline.statistics.gap_tallies import GapPeriod, GapTally
from zombie_pipeline.statistics.heartbeat_timeout import suggest_heartbeat_timeout
from zombie_pipeline.statistics.quantiles import PERCENTILES

#: Every label a metric may carry: each takes a bounded set of values (a dataset never is one).
BOUNDED_LABELS = {"job_type", "worker_type", "reason", "cause", "error_code", "outcome", "quantile"}
UTC = dt.UTC


def exposed(figures: metrics.Figures) -> dict[tuple[str, tuple], float]:
    """What Prometheus reads of the figures: ``(sample name, sorted labels) -> value``."""
    registry = CollectorRegistry()
    registry.register(figures)
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_every_metric_is_named_as_prometheus_conventions_want():
    assert len(metrics.METRIC_NAMES) == len(metrics.METRICS)
    for metric in metrics.METRICS:
        assert re.fullmatch(r"zombie_pipeline_[a-z0-9_]+", metric.name), metric.name
        assert metric.name.endswith("_total") == (metric.kind == "counter"), metric.name
        assert set(metric.labels) <= BOUNDED_LABELS, metric.name
        assert metric.help.endswith((".", ")")) and len(metric.help) > 10, metric.name
        if "duration" in metric.name or "timestamp" in metric.name:
            assert metric.name.endswith("_seconds"), metric.name  # base units
        if "_ratio" in metric.name:
            assert metric.name.endswith("_ratio"), metric.name


def test_figures_refuse_labels_other_than_their_metrics():
    figures = metrics.Figures()
    with pytest.raises(
        ValueError, match=r"zombie_pipeline_started_jobs takes the labels \['job_type'\], not \['dataset'\]"
    ):
        figures.set(metrics.STARTED_JOBS, 1, dataset="user/big")
    with pytest.raises(ValueError, match="not one of the pipeline's metrics"):
        figures.set(metrics.Metric("other_total", "counter", "Another."), 1)


def test_counters_are_exposed_with_their_total_and_labels(store):
    figures = (
        metrics.Figures()
        .set(metrics.RETRIES, 3, job_type="/splits", cause="deploy", outcome="enqueued")
        .set(metrics.WAITING_JOBS, 7)
    )
    assert exposed(figures) == {
        ("zombie_pipeline_retries_total", (("cause", "deploy"), ("job_type", "/splits"), ("outcome", "enqueued"))): 3.0,
        ("zombie_pipeline_waiting_jobs", ()): 7.0,
    }


def test_the_audit_totals_count_the_finalized_events_by_type_reason_and_outcome(store):
    fresher = crashed_job("user/fresher", "/first-rows")
    store.jobs.insert_many(
        [crashed_job(f"user/c{i}") for i in range(3)]
        + [job_document("/first-rows", "user/never", started_at=ago(900)), fresher]
        + [healthy_job(f"user/h{i}") for i in range(10)]
    )
    store.cache.insert_one(cache_document(fresher, ago(60)))
    run_cleanup(store, ZombiePolicy(), "run-1")
    # an event written by hand, whose type cannot be a label value, is counted apart
    store.events.insert_one(
        {ID: ObjectId(), Event.STATE: EventState.DONE, Event.JOB: {Job.TYPE: 42}, Event.REASON: "missing_heartbeat"}
    )

    totals = trail.audit_totals(store.events, metrics.DETECTION_BUCKETS, metrics.RELEASE_LAG_BUCKETS)

    assert totals.finalized == {  # five workers dead alone: crashes (and one that never started)
        ("/splits", "missing_heartbeat", "JobManagerCrashedError", "crash"): 3,
        ("/first-rows", "never_heartbeated", "JobManagerCrashedError", "never_started"): 1,
        ("/first-rows", "missing_heartbeat", "JobManagerCrashedError", "crash"): 1,
    }
    assert totals.fresher_kept == {"/first-rows": 1}
    done = store.events.find({Event.STATE: EventState.DONE, f"{Event.JOB}.{Job.TYPE}": {"$type": "string"}})
    assert totals.retries == Counter(
        (event[Event.JOB][Job.TYPE], event[Event.CAUSE], event[Event.RETRY_OUTCOME]) for event in done
    )
    assert totals.retries[("/first-rows", "crash", RetryOutcome.NOT_RETRIED)] == 1  # the fresher result: no retry
    assert totals.skipped == 1


def test_a_cleanups_figures_are_the_audit_totals_and_the_runs_own_counts():
    totals = trail.AuditTotals(
        finalized=Counter({("/splits", "missing_heartbeat", "JobManagerCrashedError", "deploy"): 4}),
        fresher_kept=Counter({"/splits": 1}),
        retries=Counter({("/splits", "deploy", "enqueued"): 3}),
    )
    started = dt.datetime(2026, 5, 1, 12, tzinfo=UTC)
    figures = metrics.cleanup_figures(
        totals, {"lost_to_live_worker": 2, "due_retry_enqueued": 1, "compensation_failed": 1},
        {("/splits", "missing_heartbeat"): 6}, started, started + dt.timedelta(seconds=3.5),
        heartbeat_timeout_seconds=300,
    )  # fmt: skip
    values = exposed(figures)
    assert (
        values[
            (
                "zombie_pipeline_zombies_finalized_total",
                (
                    ("cause", "deploy"),
                    ("error_code", "JobManagerCrashedError"),
                    ("job_type", "/splits"),
                    ("reason", "missing_heartbeat"),
                ),
            )
        ]
        == 4
    )
    labels = (("cause", "deploy"), ("job_type", "/splits"), ("outcome", "enqueued"))
    assert values[("zombie_pipeline_retries_total", labels)] == 3
    assert (
        values[("zombie_pipeline_cleanup_zombies_found", (("job_type", "/splits"), ("reason", "missing_heartbeat")))]
        == 6
    )
    assert values[("zombie_pipeline_cleanup_races_lost", ())] == 2
    assert values[("zombie_pipeline_cleanup_delayed_retries_enqueued", ())] == 1
    assert values[("zombie_pipeline_cleanup_compensations", (("outcome", "failed"),))] == 1
    assert values[("zombie_pipeline_cleanup_compensations", (("outcome", "done"),))] == 0
    assert values[("zombie_pipeline_cleanup_duration_seconds", ())] == 3.5
    assert values[("zombie_pipeline_cleanup_last_success_timestamp_seconds", ())] == started.timestamp() + 3.5
    assert values[("zombie_pipeline_policy_heartbeat_timeout_seconds", ())] == 300
    assert {metrics.METRIC_OF_SAMPLE[name] for name, _ in values} == {metric.name for metric in metrics.CLEANUP_METRICS}


def test_detection_times_are_a_histogram_per_reason_counted_from_the_audit_trail(store):
    """Each finalization's detection time, as its event recorded it, falls in the buckets at or above it."""
    silent = [
        job_document(dataset=f"user/z-{i}", started_at=ago(900), last_heartbeat=ago(300 + 100 * i)) for i in range(3)
    ]
    store.jobs.insert_many([*silent, job_document(dataset="user/never", started_at=ago(1000))])
    run_cleanup(store, ZombiePolicy(), "run-1")
    recorded = sorted(
        event[Event.DETECTION_SECONDS] for event in store.events.find({Event.REASON: "missing_heartbeat"})
    )

    totals = trail.audit_totals(store.events, metrics.DETECTION_BUCKETS, metrics.RELEASE_LAG_BUCKETS)
    values = exposed(metrics.cleanup_figures(totals, {}, {}, ago(5), ago(0), heartbeat_timeout_seconds=300))

    def bucket(reason: str, le: str) -> float:
        return values[("zombie_pipeline_detection_seconds_bucket", (("le", le), ("reason", reason)))]

    assert [round(seconds, -1) for seconds in recorded] == [300, 400, 500]  # measured now: a few seconds more
    assert (bucket("missing_heartbeat", "300"), bucket("missing_heartbeat", "420")) == (0, 2)
    assert (bucket("missing_heartbeat", "540"), bucket("missing_heartbeat", "+Inf")) == (3, 3)
    assert values[("zombie_pipeline_detection_seconds_sum", (("reason", "missing_heartbeat"),))] == pytest.approx(
        sum(recorded)
    )
    assert [bucket("never_heartbeated", le) for le in ("900", "1800", "+Inf")] == [0, 1, 1]  # started 1,000 s ago
    assert bucket("terminated", "+Inf") == 0  # a reason nothing died of: an empty histogram, not a missing one


def test_release_lags_are_a_histogram_per_reason_counted_from_the_audit_trail(store):
    """A cleanup run long after the deadlines records how long after each one it came; the histogram counts them."""
    late = [
        job_document(dataset=f"user/z-{i}", started_at=ago(900), last_heartbeat=ago(300 + seconds))
        for i, seconds in enumerate((3, 40, 400))
    ]
    store.jobs.insert_many(late)
    run_cleanup(store, ZombiePolicy(), "run-1")
    recorded = sorted(event[Event.RELEASE_LAG_SECONDS] for event in store.events.find())

    values = exposed(
        metrics.cleanup_figures(
            trail.audit_totals(store.events, metrics.DETECTION_BUCKETS, metrics.RELEASE_LAG_BUCKETS),
            {},
            {},
            ago(5),
            ago(0),
            heartbeat_timeout_seconds=300,
        )
    )

    def bucket(le: str) -> float:
        return values[("zombie_pipeline_release_lag_seconds_bucket", (("le", le), ("reason", "missing_heartbeat")))]

    assert [round(seconds, -1) for seconds in recorded] == [0, 40, 400]  # measured now: a fraction of a second more
    assert [bucket(le) for le in ("2", "5", "60", "300", "600", "+Inf")] == [0, 1, 2, 2, 3, 3]
    assert values[("zombie_pipeline_release_lag_seconds_sum", (("reason", "missing_heartbeat"),))] == pytest.approx(
        sum(recorded)
    )
    assert values[("zombie_pipeline_release_lag_seconds_count", (("reason", "terminated"),))] == 0


def test_a_cleanup_that_found_nothing_pushes_zeros_for_every_job_type_reason_and_outcome_it_knows():
    """A series absent is a blank panel, not a zero; a counter first seen at 1 hides its first increase."""
    totals = trail.AuditTotals(
        finalized=Counter({("/splits", "missing_heartbeat", "JobManagerCrashedError", "crash"): 4})
    )
    started = dt.datetime(2026, 5, 1, 12, tzinfo=UTC)

    values = exposed(metrics.cleanup_figures(totals, {}, {}, started, started, heartbeat_timeout_seconds=300))

    def series(name: str) -> dict[tuple, float]:
        return {labels: value for (sample, labels), value in values.items() if sample == name}

    found = series("zombie_pipeline_cleanup_zombies_found")
    assert found == {(("job_type", "/splits"), ("reason", str(reason))): 0 for reason in REASONS}
    assert series("zombie_pipeline_fresher_cache_entries_kept_total") == {(("job_type", "/splits"),): 0}
    retries = series("zombie_pipeline_retries_total")
    assert retries == {
        (("cause", str(cause)), ("job_type", "/splits"), ("outcome", str(outcome))): 0
        for cause in CAUSES
        for outcome in RetryOutcome
    }
    finalized = series("zombie_pipeline_zombies_finalized_total")
    # each reason with each cause it can have; the 4 counted, the others at 0
    assert len(finalized) == sum(len(CAUSES_OF_REASON[reason]) for reason in REASONS) and sum(finalized.values()) == 4
    assert (
        finalized[
            (
                ("cause", "timeout"),
                ("error_code", "JobManagerExceededMaximumDurationError"),
                ("job_type", "/splits"),
                ("reason", "exceeded_max_duration"),
            )
        ]
        == 0
    )


@pytest.mark.parametrize(
    ("engaged", "stale", "started", "ratio"),
    [(True, 30, 40, 0.75), (False, 2, 40, 0.05), (False, 0, None, 0.0), (False, 3, None, None)],
)
def test_the_brake_figures_say_whether_it_stopped_the_cleanup_and_the_share_it_judged(engaged, stale, started, ratio):
    values = exposed(metrics.brake_figures(engaged, stale, started, 0.5))
    assert values[("zombie_pipeline_brake_engaged", ())] == int(engaged)
    assert values[("zombie_pipeline_brake_max_stale_ratio", ())] == 0.5
    assert (
        values.get(("zombie_pipeline_brake_stale_ratio", ())) == ratio
    )  # not counted (the brake overridden): no share


def test_started_jobs_are_counted_per_type_on_the_started_index(store):
    store.jobs.insert_many(
        [healthy_job(f"user/s{i}") for i in range(3)] + [healthy_job("user/f", "/first-rows"), crashed_job("user/c")]
    )
    store.jobs.insert_one({**healthy_job("user/bad"), Job.TYPE: "$bad"})  # not a type: no label
    assert metrics.started_by_type(store.jobs) == {"/splits": 4, "/first-rows": 1}


def test_the_health_figures_are_the_snapshot():
    snapshot = QueueSnapshot(
        started=5, waiting=9, stale=1, unfinished_finalizations=2, zombies_finalized_last_24h=4,
        retries_waiting_for_their_delay=3, compensations_pending=6, compensations_given_up=7, quarantined=4,
    )  # fmt: skip
    values = exposed(metrics.health_figures(snapshot, {"/splits": 5}, repeat_offenders=8))
    assert values == {
        ("zombie_pipeline_started_jobs", (("job_type", "/splits"),)): 5,
        ("zombie_pipeline_waiting_jobs", ()): 9,
        ("zombie_pipeline_stale_jobs", ()): 1,
        ("zombie_pipeline_unfinished_finalizations", ()): 2,
        ("zombie_pipeline_retries_waiting", ()): 3,
        ("zombie_pipeline_compensations_pending", ()): 6,
        ("zombie_pipeline_compensations_failed", ()): 7,
        ("zombie_pipeline_repeat_offender_datasets", ()): 8,
        ("zombie_pipeline_quarantined_datasets", ()): 4,
    }


def test_the_statistics_figures_are_the_reports_suggestions_and_the_runs_behind_them():
    report = report_suggesting({"/splits": 600, "/first-rows": 1800})
    values = exposed(metrics.statistics_figures(report))
    for entry in report.types:
        labels = (("job_type", entry.job_type),)
        assert values[("zombie_pipeline_suggested_max_duration_seconds", labels)] == entry.suggested_t2_seconds
        assert values[("zombie_pipeline_configured_max_duration_seconds", labels)] == 1200
        assert values[("zombie_pipeline_suggestion_successful_runs", labels)] == entry.successes == 400
        assert values[("zombie_pipeline_suggestion_censored", labels)] == 0
        assert values[("zombie_pipeline_suggestion_made", labels)] == 1
        quantiles = {
            dict(key)["quantile"]
            for name, key in values
            if name == "zombie_pipeline_successful_run_duration_seconds" and dict(key)["job_type"] == entry.job_type
        }
        assert quantiles == {f"{q:g}" for q in PERCENTILES} == {"0.5", "0.9", "0.95", "0.99"}
    assert values[("zombie_pipeline_statistics_window_end_timestamp_seconds", ())] == report.window_end.timestamp()


def test_a_type_without_enough_runs_has_no_suggestion_pushed():
    report = report_suggesting({"/splits": 600})
    report.types[0].enough_data = False
    values = exposed(metrics.statistics_figures(report))
    assert not any(name == "zombie_pipeline_suggested_max_duration_seconds" for name, _ in values)
    assert values[("zombie_pipeline_configured_max_duration_seconds", (("job_type", "/splits"),))] == 1200
    assert values[("zombie_pipeline_suggestion_made", (("job_type", "/splits"),))] == 0  # said, not left blank


def test_the_heartbeat_gaps_are_a_histogram_per_job_type_and_worker_size_counted_from_the_gap_logs_totals():
    gaps = [58.0, 60.0, 60.0, 61.5, 64.0, 90.0, 200.0, 700.0]
    light = GapTally(gaps=GapHistogram.of(gaps))
    totals = GapPeriod(
        start=dt.datetime(2024, 3, 1, tzinfo=UTC),
        end=dt.datetime(2024, 3, 8, tzinfo=UTC),
        tallies={("/splits", "light"): light, ("/first-rows", "any"): GapTally(gaps=GapHistogram.of([30.0]))},
    )

    values = exposed(metrics.heartbeat_gap_figures(totals))

    labels = (("job_type", "/splits"), ("worker_type", "light"))
    for bound in metrics.GAP_BUCKETS:
        le = (("job_type", "/splits"), ("le", f"{bound:g}"), ("worker_type", "light"))
        assert values[("zombie_pipeline_heartbeat_gap_seconds_bucket", le)] == sum(gap <= bound for gap in gaps)
    infinity = (("job_type", "/splits"), ("le", "+Inf"), ("worker_type", "light"))
    assert values[("zombie_pipeline_heartbeat_gap_seconds_bucket", infinity)] == len(gaps)
    assert values[("zombie_pipeline_heartbeat_gap_seconds_count", labels)] == len(gaps)
    assert values[("zombie_pipeline_heartbeat_gap_seconds_sum", labels)] == sum(gaps)
    assert (
        values[("zombie_pipeline_heartbeat_gap_seconds_count", (("job_type", "/first-rows"), ("worker_type", "any")))]
        == 1
    )


def test_the_statistics_push_the_heartbeat_timeout_their_gaps_support(store):
    report = report_suggesting({"/splits": 600})
    gaps = GapTally(gaps=GapHistogram.of([60.0 + index % 7 for index in range(4_000)]))
    policy = ZombiePolicy()
    report.heartbeat = suggest_heartbeat_timeout(
        GapPeriod(start=report.window_start, end=report.window_end, tallies={("/splits", "light"): gaps}), policy, 3
    )

    values = exposed(metrics.statistics_figures(report))

    assert report.heartbeat.suggested_seconds == 120  # the p99.9 bound (66 s) x 1.5, at the two-heartbeat floor
    assert values[("zombie_pipeline_suggested_heartbeat_timeout_seconds", ())] == 120
