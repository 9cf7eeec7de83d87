"""The watcher in Dagster: ``zombie_watch_job``, one long run at a time, and ``zombie_watch_sensor`` (``sensors.py``),
which keeps one running wherever a daemon runs.

The run's one op drives :class:`~zombie_pipeline.cleanup.watch.Watch` for an hour: every finalization a line of its
log as it happens, the whole as its metadata and summary at the end, as a cleanup's. The sensor asks for the next
run :data:`HANDOFF_SECONDS` before the current one ends, so that the successor, started by then however slow the
launcher, waits for the lease and takes over within seconds of its end; and at once when no watch holds a live
lease (none yet, one that died, one hung: a run Dagster still calls started but that renews nothing is taken for
dead, and run monitoring stops it at its ``dagster/max_runtime``). After failed runs it waits before asking again,
longer after each.

``stale_jobs_sensor`` and ``kill_zombies_schedule`` stay the fallback: the sensor asks for no cleanup while a watch
holds a live lease (``watch_lease.alive_watcher``), and takes over at its first tick after the lease lapsed.
"""

from functools import partial
from typing import Any

import dagster as dg
import numpy as np
from pydantic import Field

from zombie_pipeline import config
from zombie_pipeline.cleanup import run
from zombie_pipeline.cleanup.brake import Brake
from zombie_pipeline.cleanup.watch import Listener, Watch, WatchReport, WatchSettings
from zombie_pipeline.config import SettingError
from zombie_pipeline.defs.metadata import counts_metadata, table_metadata
from zombie_pipeline.defs.pushgateway import MetricsGateway
from zombie_pipeline.defs.resources import Databases, ZombiePolicyResource
from zombie_pipeline.defs.tags import (
    CLEANUP_GROUP,
    MAX_RUNTIME_TAG,
    PIPELINE_TAG,
    PRIORITY_TAG,
    WATCHED_QUEUE_DATABASE_TAG,
)
from zombie_pipeline.observability import metrics
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.statistics.gap_observer import GapObserver

#: How long one watch run watches, from taking the lease to handing it over.
WATCH_RUN_SECONDS = 3600
#: A successor is asked for this long before the watch run's end: more than a run takes to start, 480 s at worst on
#: Kubernetes (the Helm chart's start timeout), so that it waits for the lease rather than the queue waiting for it.
HANDOFF_SECONDS = 600
#: The watch run's runtime limit: its hour, the successor's wait for the lease (at most the handoff and a lease), and
#: a margin; past it run monitoring fails the run and stops its worker.
WATCH_MAX_RUNTIME_SECONDS = WATCH_RUN_SECONDS + HANDOFF_SECONDS + 600


def listeners(policy: ZombiePolicy) -> list[Listener]:
    """What each watch run tells of the started jobs it reads every refresh: the heartbeat gaps' observer, so that the
    gaps are recorded in the gap log wherever the watcher runs (``heartbeat_gap_tallies`` reads them)."""
    return [GapObserver(policy)]


class WatchConfig(dg.Config):
    """Options of one watch run."""

    run_minutes: float = Field(
        default=WATCH_RUN_SECONDS / 60,
        gt=0,
        le=WATCH_RUN_SECONDS / 60,
        description="How long the run watches before it hands over to its successor.",
    )


@dg.op(
    description="Keep the deadline of every started job (its last heartbeat + the timeout, its SIGTERM's grace, its "
    "start + its T2), read again every 2 s, and finalize each job at its deadline through the cleanup's own steps "
    "(the claim, compare-and-set, causes, batches, the brake). Logs each finalization; the summary at the end."
)
def watch_deadlines(
    context: dg.OpExecutionContext,
    config: WatchConfig,
    databases: Databases,
    zombie_policy: ZombiePolicyResource,
    metrics_gateway: MetricsGateway,
) -> dict[str, int]:
    policy = zombie_policy.policy()  # a refused value fails the run here, before the first command to a database
    try:
        store = databases.store()
    except SettingError as error:
        raise dg.Failure(description=str(error), allow_retries=False) from None

    def pushed(brake: Brake) -> None:  # the brake's alert, as a cleanup's find step pushes it
        figures = partial(metrics.brake_figures, brake.engaged, brake.stale, brake.started, brake.max_stale_fraction)
        metrics_gateway.push(context, figures, databases.queue_database)

    watch = Watch(
        store,
        partial(zombie_policy.in_force, store, fresh=True),
        context.run_id,
        WatchSettings(run_seconds=config.run_minutes * 60),
        listeners=listeners(policy),
        log=context.log,
        on_brake=pushed,
    )
    report = watch.run()
    summary = run.summarize(store, context.run_id, dict(report.result.counts))
    context.add_output_metadata(
        {
            **counts_metadata(summary.counts),
            **report_metadata(report),
            "finalized_jobs": table_metadata(summary.rows),
            "summary": dg.MetadataValue.md(summary.markdown()),
            "policy/heartbeat_timeout_seconds": policy.heartbeat_timeout_seconds,
        }
    )
    context.log.info(f"{summary.one_line()}; the watch ended: {report.ended_because}")
    return dict(summary.counts)


def report_metadata(report: WatchReport) -> dict[str, Any]:
    """How the watch went: its release lags' quantiles, its passes and refreshes, what held it or stopped it."""
    lags = np.asarray(report.release_lags, dtype=float)
    metadata: dict[str, Any] = {
        "release_lag_p50_seconds": round(float(np.percentile(lags, 50)), 3) if lags.size else 0.0,
        "release_lag_p99_seconds": round(float(np.percentile(lags, 99)), 3) if lags.size else 0.0,
        "release_lag_max_seconds": round(float(lags.max()), 3) if lags.size else 0.0,
        "refreshes": report.refreshes,
        "passes": report.passes,
        "holds": report.holds,
        "brake_refusals": report.brake_refusals,
        "outages": report.outages,
        "outage_seconds": round(report.outage_seconds, 1),
        "ended_because": report.ended_because,
    }
    if report.acquired_at is not None:
        metadata["watched_from"] = dg.MetadataValue.timestamp(report.acquired_at)
    return metadata


@dg.job(
    description=(
        "Release every dead job at its deadline: one long run (an hour) that keeps the deadlines of the started jobs "
        "and finalizes each one within seconds of the moment the rules allow, as kill_zombies_job would. "
        "zombie_watch_sensor keeps one running; turned off by the policy's watch_deadlines: false."
    ),
    executor_def=dg.in_process_executor,
    tags={
        PIPELINE_TAG: CLEANUP_GROUP,
        WATCHED_QUEUE_DATABASE_TAG: config.queue_database(),
        PRIORITY_TAG: "10",
        # Its hour, the wait for the lease, a margin: a watch run lost or stuck is failed by run monitoring after it,
        # and its worker stopped. Never retried by Dagster: the sensor asks for the next one.
        MAX_RUNTIME_TAG: str(WATCH_MAX_RUNTIME_SECONDS),
    },
)
def zombie_watch_job() -> None:
    watch_deadlines()
