"""The pipeline's figures as Prometheus metrics, for the dashboards and alerts operators already have.

Over 500 lines: the table of every metric (:data:`METRICS`, about 200 lines) is kept whole on purpose, each
step's figures beside it.

Cleanups, health checks and statistics are batch runs: their figures are pushed to a Pushgateway
after each run (``defs/pushgateway.py``), not scraped. This module knows nothing of Dagster nor
of the gateway. It declares every metric once (:data:`METRICS`: name, type, help, labels; the alert
rules and the dashboard name nothing else) and turns what a run knows into :class:`Figures`, a
``prometheus_client`` collector.

Names and labels follow Prometheus' conventions and dataset-viewer's vocabulary: the prefix
``zombie_pipeline_``, base units in the name (``_seconds``, ``_ratio``, ``_timestamp_seconds``),
``_total`` on counters, and bounded labels only: ``job_type`` (dataset-viewer's ``kind``),
``worker_type`` (a worker size), ``reason``, ``cause``, ``error_code``, ``outcome``, ``quantile``. A dataset is never a label. The queue
database is not a label here either: the push's grouping key adds it.

Counters are the audit trail's totals (``zombieEvents`` keeps every finalization): they only grow,
survive a gateway restart and equal what the database holds. What only a run knows (the zombies it
found, the races it lost, its duration) is a gauge of the last run.

A series absent is not a zero: a panel of it stays blank, a rate over it is empty, and a counter that
first appears at 1 never shows its first increase. So every labelled series a push knows the labels of
is pushed, at 0 where nothing happened: the reasons and retry outcomes of every job type the audit trail
or the run has seen, a 0 or 1 per type for whether the statistics had a suggestion.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.core import Metric as MetricFamily
from prometheus_client.registry import Collector
from pymongo.collection import Collection

from zombie_pipeline.cleanup.detection import started_filter
from zombie_pipeline.cleanup.results import Count
from zombie_pipeline.observability.monitoring import QueueSnapshot
from zombie_pipeline.queue.audit_documents import RetryOutcome
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, job_type_problem
from zombie_pipeline.queue.reasons import CAUSES, CAUSES_OF_REASON, ERROR_CODE_OF_REASON, REASONS
from zombie_pipeline.queue.store import aggregate_rows
from zombie_pipeline.trail import AuditTotals, Histogram

if TYPE_CHECKING:  # the cleanup pushes its figures without the statistics' pandas
    from zombie_pipeline.statistics.analysis import DurationReport
    from zombie_pipeline.statistics.gap_tallies import GapPeriod

PREFIX = "zombie_pipeline_"


@dataclass(frozen=True)
class Metric:
    """One metric as exposed: a counter's name ends in ``_total``."""

    name: str
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()

    def family(self) -> CounterMetricFamily | GaugeMetricFamily:
        """The family of a counter or a gauge (a histogram's is built with its buckets)."""
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.help, labels=self.labels)
        return GaugeMetricFamily(self.name, self.help, labels=self.labels)


def _counter(name: str, help: str, *labels: str) -> Metric:
    return Metric(PREFIX + name + "_total", "counter", help, labels)


def _gauge(name: str, help: str, *labels: str) -> Metric:
    return Metric(PREFIX + name, "gauge", help, labels)


def _histogram(name: str, help: str, *labels: str) -> Metric:
    return Metric(PREFIX + name, "histogram", help, labels)


# --- pushed by a cleanup (report_cleanup): the audit trail's totals, and the last cleanup's own figures -------------

ZOMBIES_FINALIZED = _counter(
    "zombies_finalized",
    "Zombies finalized, by job type, reason, the error code users see and the cause of the death (deploy, crash, "
    "never_started, timeout) (the audit trail's count).",
    "job_type",
    "reason",
    "error_code",
    "cause",
)
FRESHER_ENTRIES_KEPT = _counter(
    "fresher_cache_entries_kept",
    "Finalized zombies whose cache entry was kept because it was fresher than the error.",
    "job_type",
)
RETRIES = _counter(
    "retries",
    "Finalized zombies by the cause of their death and what became of their retry: enqueued, scheduled (after a "
    "delay), already_queued, limit_reached, not_retried, quarantined.",
    "job_type",
    "cause",
    "outcome",
)
LATE_RESULTS = _counter(
    "late_results",
    "Finalized zombies whose job showed life afterwards (a heartbeat, its own result), by job type: detection's "
    "mistakes (the audit trail's count).",
    "job_type",
)
DETECTION_TIME = _histogram(
    "detection_seconds",
    "How late zombies were finalized, by reason: from the job's last sign of life (start, heartbeat, SIGTERM), or "
    "for one still running, from its maximum duration (the audit trail's detection_seconds).",
    "reason",
)
#: The detection time histogram's upper bounds, in seconds: around the heartbeat timeout (300 s) and its alert (+3 min)
#: finely, then coarsely up to an hour.
DETECTION_BUCKETS = (30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 420.0, 480.0, 540.0, 600.0, 900.0, 1800.0, 3600.0)
RELEASE_LAG = _histogram(
    "release_lag_seconds",
    "How long after its deadline (the moment the rules allowed it) each zombie was finalized, by reason: what the "
    "cleanup that finalized it, watcher or run, added to the rule (the audit trail's release_lag_seconds).",
    "reason",
)
#: The release lag histogram's upper bounds, in seconds: the watcher's seconds finely, a sensor's tick and a run's start,
#: a schedule's ten minutes.
RELEASE_LAG_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
HEARTBEAT_TIMEOUT = _gauge(
    "policy_heartbeat_timeout_seconds",
    "The policy's heartbeat_timeout_seconds in the last cleanup: the detection time alert's reference.",
)
ZOMBIES_FOUND = _gauge(
    "cleanup_zombies_found", "Zombies the last cleanup found, by job type and reason.", "job_type", "reason"
)
RACES_LOST = _gauge(
    "cleanup_races_lost", "Claims of the last cleanup that a live worker won (it beat or finished meanwhile)."
)
DELAYED_RETRIES_ENQUEUED = _gauge(
    "cleanup_delayed_retries_enqueued", "Retries whose delay had passed that the last cleanup enqueued."
)
COMPENSATION_RUNS = _gauge(
    "cleanup_compensations",
    "Compensations the last cleanup ran, by outcome: done, to_retry, failed (given up on).",
    "outcome",
)
CLEANUP_DURATION = _gauge(
    "cleanup_duration_seconds", "How long the last successful cleanup took, from its first step to its summary."
)
LAST_SUCCESS = _gauge(
    "cleanup_last_success_timestamp_seconds",
    "When the last successful cleanup ended (unix time): the alert compares it with time().",
)

# --- pushed by a cleanup's detection (find_zombies), also when the brake stops it ----------------------------------

BRAKE_ENGAGED = _gauge(
    "brake_engaged", "1 when the last detection's brake stopped its cleanup (too many started jobs look dead), else 0."
)
STALE_RATIO = _gauge("brake_stale_ratio", "Share of the started jobs that looked dead at the last detection (0 to 1).")
MAX_STALE_RATIO = _gauge(
    "brake_max_stale_ratio", "The policy's max_stale_fraction: above it (and min_started_for_brake) the brake engages."
)

# --- pushed by queue_health: the queue's state after a cleanup --------------------------------------------------

STARTED_JOBS = _gauge("started_jobs", "Jobs started now, by job type.", "job_type")
WAITING_JOBS = _gauge("waiting_jobs", "Jobs waiting now.")
STALE_JOBS = _gauge("stale_jobs", "Started jobs past their heartbeat timeout, SIGTERM or maximum duration now.")
UNFINISHED_FINALIZATIONS = _gauge(
    "unfinished_finalizations", "Finalizations a crashed cleanup left half done (the next cleanup completes them)."
)
RETRIES_WAITING = _gauge("retries_waiting", "Retries waiting for their delay (zombieRetries).")
COMPENSATIONS_PENDING = _gauge(
    "compensations_pending", "Finalized zombies whose compensations still run, or failed and will be tried again."
)
COMPENSATIONS_FAILED = _gauge(
    "compensations_failed", "Finalized zombies with a compensation given up on after its last attempt."
)
REPEAT_OFFENDERS = _gauge(
    "repeat_offender_datasets",
    "Datasets finalized at least 3 times in the last 7 days (the repeat_offenders asset lists them).",
)
QUARANTINED_DATASETS = _gauge(
    "quarantined_datasets",
    "(Dataset, job type) pairs quarantined now: their workers crashed quarantine_after_crashes times within "
    "quarantine_window_hours, and they are not re-enqueued (repeat_offenders lists them; lift_quarantine_job lifts one).",
)

# --- pushed by job_duration_statistics: the suggestions of the current window ------------------------------------

SUGGESTED_MAX_DURATION = _gauge(
    "suggested_max_duration_seconds",
    "Suggested maximum duration (T2) per job type, where the window had enough successful runs.",
    "job_type",
)
SUGGESTION_MADE = _gauge(
    "suggestion_made",
    "1 when the window had enough successful runs of the job type for a suggested T2 (then pushed), else 0.",
    "job_type",
)
CONFIGURED_MAX_DURATION = _gauge(
    "configured_max_duration_seconds",
    "Maximum duration (T2) per job type in force when the statistics ran.",
    "job_type",
)
SUGGESTION_RUNS = _gauge(
    "suggestion_successful_runs", "Successful runs of the window behind each job type's suggestion.", "job_type"
)
SUCCESSFUL_RUN_DURATION = _gauge(
    "successful_run_duration_seconds",
    "Percentiles of the window's successful run durations, per job type.",
    "job_type",
    "quantile",
)
SUGGESTION_CENSORED = _gauge(
    "suggestion_censored",
    "1 when so many jobs of the type were stopped at T2 that the suggestion is only a lower bound.",
    "job_type",
)
STATISTICS_WINDOW_END = _gauge(
    "statistics_window_end_timestamp_seconds", "End of the window the pushed statistics describe (unix time)."
)
SUGGESTED_HEARTBEAT_TIMEOUT = _gauge(
    "suggested_heartbeat_timeout_seconds",
    "The heartbeat timeout the window's heartbeat gaps support (the current one where they support no lower one).",
)

# --- pushed by heartbeat_gap_tallies: the gaps a watcher saw since its first watch ---------------------------------

HEARTBEAT_GAP = _histogram(
    "heartbeat_gap_seconds",
    "Gaps between the signs of life (start, heartbeats) of live jobs, as a watcher saw them, by job type and the worker "
    "size their difficulty sends them to ('any' where the queue records none) (the gap log's totals).",
    "job_type",
    "worker_type",
)
#: The gap histogram's upper bounds, in seconds: finely around the deployment's one-minute heartbeat, then up to the
#: heartbeat timeout and past it. Whole seconds: each is an edge of the gap log's buckets, so each count is exact.
GAP_BUCKETS = (5.0, 10.0, 20.0, 30.0, 45.0, 55.0, 60.0, 65.0, 75.0, 90.0, 120.0, 180.0, 240.0, 300.0, 600.0)

CLEANUP_METRICS = (
    ZOMBIES_FINALIZED, FRESHER_ENTRIES_KEPT, RETRIES, LATE_RESULTS, DETECTION_TIME, RELEASE_LAG, HEARTBEAT_TIMEOUT, ZOMBIES_FOUND,
    RACES_LOST, DELAYED_RETRIES_ENQUEUED, COMPENSATION_RUNS, CLEANUP_DURATION, LAST_SUCCESS,
)  # fmt: skip
BRAKE_METRICS = (BRAKE_ENGAGED, STALE_RATIO, MAX_STALE_RATIO)
HEALTH_METRICS = (
    STARTED_JOBS, WAITING_JOBS, STALE_JOBS, UNFINISHED_FINALIZATIONS, RETRIES_WAITING, COMPENSATIONS_PENDING,
    COMPENSATIONS_FAILED, REPEAT_OFFENDERS, QUARANTINED_DATASETS,
)  # fmt: skip
STATISTICS_METRICS = (
    SUGGESTED_MAX_DURATION, SUGGESTION_MADE, CONFIGURED_MAX_DURATION, SUGGESTION_RUNS, SUCCESSFUL_RUN_DURATION, SUGGESTION_CENSORED,
    STATISTICS_WINDOW_END, SUGGESTED_HEARTBEAT_TIMEOUT,
)  # fmt: skip
GAP_METRICS = (HEARTBEAT_GAP,)
#: Every metric the pipeline pushes: the one list the alert rules and the dashboard are checked against.
METRICS = CLEANUP_METRICS + BRAKE_METRICS + HEALTH_METRICS + STATISTICS_METRICS + GAP_METRICS
METRIC_NAMES = frozenset(metric.name for metric in METRICS)


def samples_of(metric: Metric) -> tuple[str, ...]:
    """The names Prometheus keeps a metric's samples under: a histogram's are its buckets, count and sum."""
    if metric.kind == "histogram":
        return tuple(f"{metric.name}_{suffix}" for suffix in ("bucket", "count", "sum"))
    return (metric.name,)


#: The metric of every sample name a query may use (a histogram's ``_bucket``: the histogram).
METRIC_OF_SAMPLE = {sample: metric.name for metric in METRICS for sample in samples_of(metric)}


class Figures(Collector):
    """Samples of some of :data:`METRICS`; registered in a ``CollectorRegistry``, it exposes (or pushes) them."""

    def __init__(self) -> None:
        self._samples: dict[Metric, dict[tuple[str, ...], float]] = {}
        self._histograms: dict[Metric, dict[tuple[str, ...], Histogram]] = {}

    def set(self, metric: Metric, value: float, **labels: str) -> Figures:
        """The value of ``metric`` for these labels, which must be exactly the metric's."""
        self._samples.setdefault(self._checked(metric, "counter", "gauge"), {})[self._key(metric, labels)] = float(
            value
        )
        return self

    def set_histogram(self, metric: Metric, histogram: Histogram, **labels: str) -> Figures:
        """The cumulative buckets and sum of the histogram ``metric`` for these labels."""
        self._histograms.setdefault(self._checked(metric, "histogram"), {})[self._key(metric, labels)] = histogram
        return self

    @property
    def metrics(self) -> tuple[Metric, ...]:
        return (*self._samples, *self._histograms)

    def collect(self) -> Iterator[MetricFamily]:
        for metric, samples in self._samples.items():
            family = metric.family()
            for labels, value in sorted(samples.items()):
                family.add_metric(list(labels), value)
            yield family
        for metric, histograms in self._histograms.items():
            histogram_family = HistogramMetricFamily(metric.name, metric.help, labels=metric.labels)
            for labels, histogram in sorted(histograms.items()):
                histogram_family.add_metric(list(labels), histogram.buckets(), histogram.total)
            yield histogram_family

    @staticmethod
    def _checked(metric: Metric, *kinds: str) -> Metric:
        if metric not in METRICS:
            raise ValueError(f"{metric.name} is not one of the pipeline's metrics (metrics.METRICS)")
        if metric.kind not in kinds:
            raise ValueError(f"{metric.name} is a {metric.kind}")
        return metric

    @staticmethod
    def _key(metric: Metric, labels: Mapping[str, str]) -> tuple[str, ...]:
        if set(labels) != set(metric.labels):
            raise ValueError(f"{metric.name} takes the labels {list(metric.labels)}, not {sorted(labels)}")
        return tuple(str(labels[name]) for name in metric.labels)


# --- what a cleanup pushes ---------------------------------------------------------------------------------------


_RETRY_OUTCOMES = {str(outcome) for outcome in RetryOutcome}
_COUNT = "count"


def no_observations(bounds: tuple[float, ...]) -> Histogram:
    return Histogram(bounds, (0,) * len(bounds), 0, 0.0)


def cleanup_figures(
    totals: AuditTotals,
    run_counts: Mapping[str, int],
    found: Mapping[tuple[str, str], int],
    started_at: dt.datetime,
    ended_at: dt.datetime,
    heartbeat_timeout_seconds: int,
) -> Figures:
    """A successful cleanup: the audit trail's totals, and this run's own counts (``cleanup.RunSummary.counts``).

    ``found``: the zombies detection returned, by (job type, reason). Every job type the audit trail or this run
    has seen gets each reason (with each cause it can have) and each cause's retry outcomes, at 0 where nothing
    happened (a blank panel is not a zero); every reason a detection time histogram, empty where none was recorded.
    """
    figures = Figures()
    job_types = sorted({job_type for job_type, *_ in totals.finalized} | {job_type for job_type, _ in found})
    finalized = {
        (job_type, str(reason), str(ERROR_CODE_OF_REASON[reason]), str(cause)): 0
        for job_type in job_types
        for reason in REASONS
        for cause in CAUSES_OF_REASON[reason]
    }
    finalized.update(totals.finalized)
    for (job_type, reason, code, cause), count in finalized.items():
        figures.set(ZOMBIES_FINALIZED, count, job_type=job_type, reason=reason, error_code=code, cause=cause)
    for reason in REASONS:
        histogram = totals.detection.get(reason) or no_observations(DETECTION_BUCKETS)
        figures.set_histogram(DETECTION_TIME, histogram, reason=reason)
        lags = totals.release_lag.get(reason) or no_observations(RELEASE_LAG_BUCKETS)
        figures.set_histogram(RELEASE_LAG, lags, reason=reason)
    figures.set(HEARTBEAT_TIMEOUT, heartbeat_timeout_seconds)
    for job_type in job_types:
        figures.set(FRESHER_ENTRIES_KEPT, totals.fresher_kept.get(job_type, 0), job_type=job_type)
        figures.set(LATE_RESULTS, totals.late_results.get(job_type, 0), job_type=job_type)
        for cause in CAUSES:
            for retry in _RETRY_OUTCOMES:
                count = totals.retries.get((job_type, str(cause), retry), 0)
                figures.set(RETRIES, count, job_type=job_type, cause=cause, outcome=retry)
        for reason in REASONS:
            figures.set(ZOMBIES_FOUND, found.get((job_type, str(reason)), 0), job_type=job_type, reason=reason)
    figures.set(RACES_LOST, run_counts.get(Count.LOST_TO_LIVE_WORKER, 0))
    figures.set(DELAYED_RETRIES_ENQUEUED, run_counts.get(Count.DUE_RETRY_ENQUEUED, 0))
    for outcome, name in _COMPENSATION_OUTCOMES.items():
        figures.set(COMPENSATION_RUNS, run_counts.get(name, 0), outcome=outcome)
    figures.set(CLEANUP_DURATION, max((ended_at - started_at).total_seconds(), 0.0))
    figures.set(LAST_SUCCESS, ended_at.timestamp())
    return figures


#: The ``outcome`` label of each compensation count of a run.
_COMPENSATION_OUTCOMES = {
    "done": Count.COMPENSATION_DONE,
    "to_retry": Count.COMPENSATION_TO_RETRY,
    "failed": Count.COMPENSATION_FAILED,
}


def brake_figures(engaged: bool, stale: int, started: int | None, max_stale_fraction: float) -> Figures:
    """What the brake judged; ``started`` None when it was not counted (the brake overridden): no ratio then."""
    figures = Figures().set(BRAKE_ENGAGED, int(engaged)).set(MAX_STALE_RATIO, max_stale_fraction)
    if stale == 0:
        figures.set(STALE_RATIO, 0.0)
    elif started:
        figures.set(STALE_RATIO, stale / started)
    return figures


# --- what queue_health pushes ---------------------------------------------------------------------------------


def started_by_type(jobs: Collection[JobDocument]) -> dict[str, int]:
    """Started jobs per type: one aggregation on the ``(status, started_at)`` index (a few thousand jobs at most)."""
    pipeline = on_index(started_filter(), {}, {"$group": {ID: f"${Job.TYPE}", _COUNT: {"$sum": 1}}})
    return {group[ID]: group[_COUNT] for group in aggregate_rows(jobs, pipeline) if not job_type_problem(group[ID])}


def health_figures(snapshot: QueueSnapshot, started: Mapping[str, int], repeat_offenders: int) -> Figures:
    figures = Figures()
    for job_type, count in started.items():
        figures.set(STARTED_JOBS, count, job_type=job_type)
    figures.set(WAITING_JOBS, snapshot.waiting)
    figures.set(STALE_JOBS, snapshot.stale)
    figures.set(UNFINISHED_FINALIZATIONS, snapshot.unfinished_finalizations)
    figures.set(RETRIES_WAITING, snapshot.retries_waiting_for_their_delay)
    figures.set(COMPENSATIONS_PENDING, snapshot.compensations_pending)
    figures.set(COMPENSATIONS_FAILED, snapshot.compensations_given_up)
    figures.set(REPEAT_OFFENDERS, repeat_offenders)
    figures.set(QUARANTINED_DATASETS, snapshot.quarantined)
    return figures


# --- what the statistics push ---------------------------------------------------------------------------------


def statistics_figures(report: DurationReport) -> Figures:
    """Per job type: the configured T2, the suggestion (where the data was enough), the runs and percentiles behind it."""
    from zombie_pipeline.statistics.quantiles import PERCENTILES, percentile_name  # pandas: the statistics' run only

    figures = Figures()
    for entry in report.types:
        job_type = entry.job_type
        figures.set(CONFIGURED_MAX_DURATION, entry.current_t2_seconds, job_type=job_type)
        figures.set(SUGGESTION_RUNS, entry.successes, job_type=job_type)
        figures.set(SUGGESTION_CENSORED, int(entry.censored), job_type=job_type)
        figures.set(SUGGESTION_MADE, int(entry.enough_data), job_type=job_type)
        if entry.enough_data:
            figures.set(SUGGESTED_MAX_DURATION, entry.suggested_t2_seconds, job_type=job_type)
        for quantile in PERCENTILES:
            value = entry.statistics.get(percentile_name(quantile))
            if value is not None:
                figures.set(SUCCESSFUL_RUN_DURATION, value, job_type=job_type, quantile=_quantile_label(quantile))
    figures.set(STATISTICS_WINDOW_END, report.window_end.timestamp())
    if report.heartbeat is not None:
        figures.set(SUGGESTED_HEARTBEAT_TIMEOUT, report.heartbeat.suggested_seconds)
    return figures


# --- what the gap tallies push --------------------------------------------------------------------------------


def heartbeat_gap_figures(totals: GapPeriod) -> Figures:
    """Per job type and worker size, the gaps since the first watch counted into :data:`GAP_BUCKETS`."""
    figures = Figures()
    for (job_type, worker), tally in sorted(totals.tallies.items()):
        gaps = tally.gaps
        histogram = Histogram(GAP_BUCKETS, gaps.at_or_below(GAP_BUCKETS), gaps.count, gaps.total_seconds)
        figures.set_histogram(HEARTBEAT_GAP, histogram, job_type=job_type, worker_type=worker)
    return figures


def _quantile_label(quantile: float) -> str:
    """``0.5``, ``0.99``: the ``quantile`` label as Prometheus' own summaries write it."""
    return f"{quantile:g}"
