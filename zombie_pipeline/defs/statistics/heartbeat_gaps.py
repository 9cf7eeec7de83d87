"""Dagster asset: one day of the heartbeat gaps a watcher saw, for the statistics' window (``statistics.gap_log``).

``heartbeat_gap_tallies`` shares the statistics' daily partitions; ``job_duration_statistics`` reads the days of
its window, as it reads ``job_duration_tallies``, and suggests the heartbeat timeout from them. Each
materialization also pushes the gaps since the first watch to the Pushgateway, a histogram per job type and worker
size (they only grow, whichever day is materialized).
"""

import warnings

import dagster as dg

from zombie_pipeline.defs.pushgateway import MetricsGateway
from zombie_pipeline.defs.resources import Databases
from zombie_pipeline.defs.statistics.assets import DAILY_PARTITIONS, GROUP, DailyTalliesStorage
from zombie_pipeline.observability import metrics
from zombie_pipeline.statistics.formatting import format_duration
from zombie_pipeline.statistics.gap_log import read_day, read_totals
from zombie_pipeline.statistics.gap_tallies import GapPeriod, row_name

with warnings.catch_warnings():  # beta: the daily tallies' own IO manager (a day not computed loads as None)
    warnings.simplefilter("ignore", dg.BetaWarning)
    _daily_asset = dg.asset(
        group_name=GROUP, partitions_def=DAILY_PARTITIONS, kinds={"mongodb"}, io_manager_def=DailyTalliesStorage()
    )


@_daily_asset
def heartbeat_gap_tallies(
    context: dg.AssetExecutionContext, databases: Databases, metrics_gateway: MetricsGateway
) -> dg.Output[GapPeriod]:
    """Per job type and worker size, one UTC day: the gaps between live jobs' heartbeats a watcher saw, and how its
    jobs ended (finished, finalized by us, unseen), read from ``zombieHeartbeatGaps`` by its day index."""
    day = context.partition_time_window.start.date()
    with databases.store_for(context, "heartbeat_gap_tallies: reading a day of heartbeat gaps") as store:
        period = read_day(store.heartbeat_gaps, day)
        totals = read_totals(store.heartbeat_gaps)
    pushed = metrics_gateway.push(context, lambda: metrics.heartbeat_gap_figures(totals), databases.queue_database)
    rows = ["| type | gaps | p99 | longest | finished |", "|---|---|---|---|---|"]
    for (job_type, worker), tally in sorted(period.tallies.items()):
        rows.append(
            f"| {row_name(job_type, worker)} | {tally.gaps.count:,} | {format_duration(tally.gaps.quantile(0.99))} | "
            f"{format_duration(tally.gaps.longest if tally.gaps.count else None)} | {tally.finished.count:,} |"
        )
    return dg.Output(
        period,
        metadata={
            "gaps": period.gaps,
            "finished_jobs": sum(tally.finished.count for tally in period.tallies.values()),
            "skipped_documents": period.malformed,
            "types": dg.MetadataValue.md("\n".join(rows)),
            **pushed,
        },
    )
