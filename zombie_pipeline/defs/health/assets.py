"""Asset checks: the invariants a cleanup must leave behind, on the asset ``queue_health``.

``kill_zombies_job`` is an op job: it changes the queue but materializes no
asset. So the queue's state after a cleanup is an asset of its own,
``queue_health`` (counts of started, waiting and stale jobs, unfinished
finalizations; the policy), and its four checks are what a cleanup must leave behind:

- ``no_zombies_left``: no job that was already a zombie when the cleanup
  started is still ``started``. Jobs that went stale since are the next
  cleanup's work, not a failure of this one.
- ``zombies_have_cache_errors``: every finalization of the last days whose
  cache error was written still finds that error in the cache, unless a newer
  result replaced it;
- ``compensations_succeed``: no compensation failing (a warning) or given up on;
- ``cleanups_are_recent``, about the cleanups rather than one of them: a
  cleanup of the queue succeeded within the last N minutes
  (``defs/health/recency.py``); ``cleanup_overdue_sensor`` reports it.

``queue_health_job`` materializes the asset and runs its checks;
``cleanup_checks_sensor`` (``sensors.py``) launches it after every successful
cleanup, tagged with that cleanup's run id, so the checks judge the cleanup's
own scope (its start time, and its job types as its tags say them). Launched by hand, the checks judge
the queue as it is now, over every type.
"""

import datetime as dt
from dataclasses import dataclass
from typing import Any

import dagster as dg
from pydantic import Field

from zombie_pipeline.cleanup import compensations
from zombie_pipeline.config import CLEANUP_OVERDUE_MINUTES_ENV, DEFAULT_CLEANUP_OVERDUE_MINUTES, cleanup_overdue_minutes
from zombie_pipeline.defs.health import recency
from zombie_pipeline.defs.metadata import malformed_metadata, table_metadata
from zombie_pipeline.defs.pushgateway import MetricsGateway
from zombie_pipeline.defs.resources import Databases, ZombiePolicyResource
from zombie_pipeline.defs.tags import CLEANUP_GROUP, CLEANUP_RUN_TAG, scope_of_tags
from zombie_pipeline.messages import counted, plural
from zombie_pipeline.observability import metrics, monitoring
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.cache import ErrorCode
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.statistics import DEFAULT_WINDOW_DAYS
from zombie_pipeline.statistics.offenders import DEFAULT_THRESHOLD, find_offenders

SAMPLE_ROWS = 20
_DEFAULT_POLICY = ZombiePolicy()


@dataclass(frozen=True)
class CleanupScope:
    """What one cleanup run was asked to do, read back from the Dagster instance."""

    run_id: str
    started_at: dt.datetime | None
    job_types: tuple[str, ...] | None  # None: every type
    dry_run: bool


def cleanup_scope(instance: dg.DagsterInstance, run_id: str) -> CleanupScope | None:
    """The scope a cleanup run's tags say (its first step tags it), and when it started."""
    record = instance.get_run_record_by_id(run_id)
    if record is None:
        return None
    job_types, dry_run = scope_of_tags(dict(record.dagster_run.tags))
    started_at = dt.datetime.fromtimestamp(record.start_time, dt.UTC) if record.start_time else None
    return CleanupScope(run_id=run_id, started_at=started_at, job_types=job_types, dry_run=dry_run)


def _checked_cleanup(context: dg.AssetCheckExecutionContext) -> CleanupScope | None:
    run_id = context.run.tags.get(CLEANUP_RUN_TAG)
    return cleanup_scope(context.instance, run_id) if run_id else None


@dg.asset(
    group_name=CLEANUP_GROUP,
    kinds={"mongodb"},
    description=(
        "The job queue as a cleanup leaves it: started, waiting and stale jobs, finalizations a crashed "
        "cleanup left unfinished, zombies finalized in the last 24 h, repeat offenders (datasets finalized at least "
        f"{DEFAULT_THRESHOLD} times in the last {DEFAULT_WINDOW_DAYS} days), and the policy judging them. "
        "Materialized after every successful cleanup (cleanup_checks_sensor); each number is plotted over time and "
        "pushed to the Pushgateway, if there is one. Its checks are the cleanup's invariants."
    ),
)
def queue_health(
    context: dg.AssetExecutionContext,
    databases: Databases,
    zombie_policy: ZombiePolicyResource,
    metrics_gateway: MetricsGateway,
) -> dg.MaterializeResult[None]:
    source = zombie_policy.record_source(context)
    with databases.store_for(context, "queue_health: reading the queue") as store:
        policy = zombie_policy.in_force(store)
        now = utc_now()
        snapshot = monitoring.queue_snapshot(store, policy, now)
        window_start = now - dt.timedelta(days=DEFAULT_WINDOW_DAYS)
        offenders = find_offenders(store, window_start, now, DEFAULT_THRESHOLD, limit=0)
        metadata: dict[str, Any] = {
            **snapshot.as_dict(),
            "repeat_offenders": offenders.offenders_total,  # listed by the daily repeat_offenders asset
            "policy_source": source.describe(),
            "policy": dg.MetadataValue.json(policy.as_dict()),
            "queue": databases.describe()["queue"],
        }
        cleanup_run = context.run.tags.get(CLEANUP_RUN_TAG)
        if cleanup_run:
            metadata["after_cleanup_run"] = cleanup_run

        def figures() -> metrics.Figures:  # the started jobs per type read only when there is a gateway to push to
            return metrics.health_figures(snapshot, metrics.started_by_type(store.jobs), offenders.offenders_total)

        metadata.update(metrics_gateway.push(context, figures, databases.queue_database))
    return dg.MaterializeResult(metadata=metadata)


@dg.asset_check(
    asset=queue_health,
    name="no_zombies_left",
    description=(
        "No job that was already a zombie when the checked cleanup started is still started: none past the heartbeat "
        "timeout, SIGTERMed longer ago than it, or past its maximum duration, under the policy and in the job types of "
        f"that cleanup (by default {_DEFAULT_POLICY.heartbeat_timeout_seconds} s without a heartbeat, "
        f"{_DEFAULT_POLICY.max_duration_seconds} s at most). Jobs that died since are the next cleanup's. "
        "Launched by hand, after no cleanup: no zombie right now, in any type."
    ),
)
def no_zombies_left(
    context: dg.AssetCheckExecutionContext, databases: Databases, zombie_policy: ZombiePolicyResource
) -> dg.AssetCheckResult:
    scope = _checked_cleanup(context)
    as_of = scope.started_at if scope and scope.started_at else utc_now()
    job_types = scope.job_types if scope else None
    with databases.store_for(context, "no_zombies_left: looking for zombies left") as store:
        left = monitoring.zombies_left(store.jobs, zombie_policy.in_force(store), as_of, job_types)
    rows = [candidate.row() for candidate in left.candidates[:SAMPLE_ROWS]]
    metadata: dict[str, Any] = {
        "as_of": dg.MetadataValue.timestamp(as_of),
        "job_types": dg.MetadataValue.json(list(job_types) if job_types else "all"),
        "zombies_left": len(left.candidates),
    }
    if rows:
        metadata["zombies"] = table_metadata(rows)
    if scope:
        metadata["cleanup_run"] = scope.run_id
    metadata.update(malformed_metadata(left.malformed, SAMPLE_ROWS))
    count = len(left.candidates) + len(left.malformed)
    return dg.AssetCheckResult(
        passed=count == 0,
        metadata=metadata,
        description=None
        if count == 0
        else f"{counted(len(left.candidates), 'job')} that {plural(len(left.candidates), 'was a zombie', 'were zombies')} "
        f"at {as_of:%Y-%m-%d %H:%M:%S} UTC {plural(len(left.candidates), 'is', 'are')} still started"
        + (f"; {counted(len(left.malformed), 'started job')} malformed, left alone" if left.malformed else ""),
    )


class CacheErrorsCheckConfig(dg.Config):
    days: int = Field(default=7, ge=1, le=365, description="Check the finalizations of this many past days.")


@dg.asset_check(
    asset=queue_health,
    name="zombies_have_cache_errors",
    description=(
        f"Every zombie finalized in the last {CacheErrorsCheckConfig.model_fields['days'].default} days (the check's "
        "days config) whose cache error was written still has "
        f"it: its cache entry exists with the error code of its finalization ({ErrorCode.CRASHED} or "
        f"{ErrorCode.EXCEEDED_MAX_DURATION}), or a newer result replaced it since."
    ),
)
def zombies_have_cache_errors(
    context: dg.AssetCheckExecutionContext, config: CacheErrorsCheckConfig, databases: Databases
) -> dg.AssetCheckResult:
    since = utc_now() - dt.timedelta(days=config.days)
    with databases.store_for(
        context, "zombies_have_cache_errors: reading the cache entries of finalized zombies"
    ) as store:
        audit = monitoring.audit_cache_errors(store, since, SAMPLE_ROWS)
    metadata: dict[str, Any] = {
        "since": dg.MetadataValue.timestamp(since),
        "finalizations_checked": audit.checked,
        "missing_entries": audit.missing,
        "entries_without_error": audit.wrong,
    }
    if audit.sample:
        metadata["offenders"] = table_metadata(audit.sample)
    return dg.AssetCheckResult(
        passed=audit.passed,
        metadata=metadata,
        description=None
        if audit.passed
        else f"of {counted(audit.checked, 'zombie')} finalized since {since:%Y-%m-%d %H:%M} UTC, {audit.missing} "
        f"{plural(audit.missing, 'has', 'have')} no cache entry and {audit.wrong} an entry without {plural(audit.wrong, 'its', 'their')} error",
    )


@dg.asset_check(
    asset=queue_health,
    name="compensations_succeed",
    description=(
        "Every compensation (an action undoing a zombie's partial side effects: an installed entry point or a "
        "webhook of the policy) succeeded: fails with a warning while some fail and will be tried again by the "
        "next cleanups, with an error once one is given up on after compensation_max_attempts."
    ),
)
def compensations_succeed(context: dg.AssetCheckExecutionContext, databases: Databases) -> dg.AssetCheckResult:
    with databases.store_for(context, "compensations_succeed: reading the compensations") as store:
        audit = compensations.audit(store, SAMPLE_ROWS)
    metadata: dict[str, Any] = {
        "given_up": audit.failed,
        "failing_to_retry": audit.retrying,
        "not_run_yet": audit.pending,
    }
    if audit.sample:
        metadata["failing"] = table_metadata(audit.sample)
    return dg.AssetCheckResult(
        passed=audit.passed,
        severity=dg.AssetCheckSeverity.ERROR if audit.failed else dg.AssetCheckSeverity.WARN,
        metadata=metadata,
        description=None
        if audit.passed
        else f"{audit.failed} compensations given up on, {audit.retrying} failing and to be tried again",
    )


@dg.asset_check(
    asset=queue_health,
    name=recency.CHECK_NAME,
    description=(
        "A cleanup of this queue database succeeded within the last "
        f"${CLEANUP_OVERDUE_MINUTES_ENV} minutes ({DEFAULT_CLEANUP_OVERDUE_MINUTES} by default): fails when cleanups "
        "fail, hang, or are not launched at all (schedule off, daemon down, ticks skipped behind a stuck run). "
        "cleanup_overdue_sensor reports it here whenever it changes and POSTs the failure webhook when it fails."
    ),
)
def cleanups_are_recent(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    verdict = recency.cleanup_recency(context.instance, utc_now(), cleanup_overdue_minutes())
    return dg.AssetCheckResult(passed=not verdict.overdue, metadata=verdict.metadata(), description=verdict.message())


queue_health_job = dg.define_asset_job(
    "queue_health_job",
    selection=dg.AssetSelection.assets(queue_health),
    description="Materialize queue_health and run its checks; launched after every successful kill_zombies_job run.",
    tags={"pipeline": CLEANUP_GROUP},
    executor_def=dg.in_process_executor,  # three small queries: a process per step would cost more than they do
)
