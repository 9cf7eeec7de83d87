"""Dagster asset: the repeat offenders of a window, wired around ``zombie_pipeline.statistics.offenders``.

``repeat_offenders`` shares the statistics' daily partitions (UTC days) and
group: partition D is the window of ``window_days`` days ending with D, so
``duration_statistics_job`` and its daily schedule materialize it beside the
tallies, and a backfill redoes past windows. It reads only our audit trail and
the cache, never the jobs: the events outlive the jobs' TTL.

Its check ``no_repeat_offenders`` (severity WARN: a dataset that keeps crashing
needs a look, not a page) is computed by the asset itself, from the same read,
so the check always judges the window and threshold of the materialization it
is attached to.
"""

import datetime as dt
from typing import Any

import dagster as dg
from pydantic import Field

from zombie_pipeline.defs.metadata import table_metadata
from zombie_pipeline.defs.resources import Databases
from zombie_pipeline.defs.statistics.assets import DAILY_PARTITIONS, GROUP
from zombie_pipeline.messages import counted
from zombie_pipeline.statistics import DEFAULT_WINDOW_DAYS
from zombie_pipeline.statistics.offenders import (
    DEFAULT_LIMIT,
    DEFAULT_THRESHOLD,
    RepeatOffenders,
    find_offenders,
)

ASSET_NAME = "repeat_offenders"
CHECK_NAME = "no_repeat_offenders"
#: Events outlive jobs, so a window may be longer than the statistics' (their tallies stop at 28 days).
MAX_WINDOW_DAYS = 90
#: Datasets named in the check's description; the table lists more.
NAMED_IN_CHECK = 10


class RepeatOffendersConfig(dg.Config):
    window_days: int = Field(
        default=DEFAULT_WINDOW_DAYS,
        ge=1,
        le=MAX_WINDOW_DAYS,
        description="Days in the window, ending with the partition's day.",
    )
    threshold: int = Field(
        default=DEFAULT_THRESHOLD,
        ge=2,
        le=1_000_000,
        description="Finalizations of one dataset in the window that make it a repeat offender (and fail the check).",
    )
    max_datasets: int = Field(
        default=100,
        ge=1,
        le=DEFAULT_LIMIT,
        description="Offenders listed in the table, the most finalized first; the rest are counted.",
    )


@dg.asset(
    name=ASSET_NAME,
    group_name=GROUP,
    partitions_def=DAILY_PARTITIONS,
    kinds={"mongodb"},
    check_specs=[
        dg.AssetCheckSpec(
            CHECK_NAME,
            asset=ASSET_NAME,
            description=(
                "No dataset was finalized as a zombie at least `threshold` times (the asset's config, default "
                f"{DEFAULT_THRESHOLD}) in the window ending with the partition's day. Fails with a warning, naming "
                "them: a dataset that keeps killing its workers needs a look (its size, its step), not more retries."
            ),
        )
    ],
)
def repeat_offenders(
    context: dg.AssetExecutionContext, config: RepeatOffendersConfig, databases: Databases
) -> dg.MaterializeResult:  # type: ignore[type-arg]  # Dagster reads the bare class (an asset with checks)
    """The datasets and job types finalized repeatedly over the window ending with this day.

    Per dataset and job type: finalizations by reason, first and last seen,
    whether the retry limit was reached or the pair is quarantined, and the last
    error (the cache entry users read, else the last event's code). From the
    audit trail, grouped on the server over the ``finalized_at`` index; malformed
    events are counted. Beside them, the quarantines holding at the window's end,
    and the pairs that used up their free re-runs in the window.
    """
    with databases.store_for(context, "repeat_offenders: reading the audit trail") as store:
        end = context.partition_time_window.end
        start = end - dt.timedelta(days=config.window_days)
        found = find_offenders(store, start, end, config.threshold, limit=config.max_datasets)
        if found.skipped:
            context.log.warning(f"{found.skipped} malformed audit events left out: {dict(found.malformed)}")
        return dg.MaterializeResult(metadata=offenders_metadata(found), check_results=[offenders_check(found)])


def offenders_metadata(found: RepeatOffenders) -> dict[str, Any]:
    """Counts plotted over the partitions, a table per (dataset, job type), the quarantines, and the report's
    section."""
    from zombie_pipeline.statistics.reports import offenders_markdown  # numpy, pandas: this asset's run only

    metadata: dict[str, Any] = {
        "window": found.window_text(),
        "threshold": found.threshold,
        "offenders": found.offenders_total,
        "offenders_listed": len(found.offenders),
        "finalizations": found.events,
        "datasets_finalized": found.datasets,
        "malformed_skipped": found.skipped,
        "job_types": dg.MetadataValue.json(
            {job_type: {**entry, "reasons": dict(entry["reasons"])} for job_type, entry in found.by_job_type().items()}
        ),
        "report": dg.MetadataValue.md(offenders_markdown(found)),
    }
    if found.malformed:
        metadata["malformed"] = dg.MetadataValue.json(dict(found.malformed))
    rows = found.rows()
    if rows:
        metadata["offenders_table"] = table_metadata(rows)
    metadata["quarantined"] = len(found.quarantined)
    if found.quarantined:
        metadata["quarantined_table"] = table_metadata(found.quarantined)
    metadata["free_runs_spent"] = len(found.free_runs_spent)
    if found.free_runs_spent:
        metadata["free_runs_spent_table"] = table_metadata(found.free_runs_spent)
    return metadata


def offenders_check(found: RepeatOffenders) -> dg.AssetCheckResult:
    names = [offender.dataset for offender in found.offenders[:NAMED_IN_CHECK]]
    more = found.offenders_total - len(names)
    quarantined = [f"{row['dataset']} {row['type']}" for row in found.quarantined[:NAMED_IN_CHECK]]
    spent = [f"{row['dataset']} {row['type']}" for row in found.free_runs_spent[:NAMED_IN_CHECK]]
    return dg.AssetCheckResult(
        check_name=CHECK_NAME,
        passed=found.offenders_total == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "threshold": found.threshold,
            "offenders": found.offenders_total,
            "datasets": dg.MetadataValue.json(names),
            "quarantined": dg.MetadataValue.json(quarantined),
            "free_runs_spent": dg.MetadataValue.json(spent),
        },
        description=None
        if found.offenders_total == 0
        else f"{counted(found.offenders_total, 'dataset')} finalized at least {counted(found.threshold, 'time')} in "
        f"{found.window_text()}: "
        + ", ".join(names)
        + (f" and {more} more" if more else "")
        + (f"; quarantined: {', '.join(quarantined)}" if quarantined else "")
        + (f"; free re-runs used up: {', '.join(spent)}" if spent else ""),
    )
