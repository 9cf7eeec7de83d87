"""``kill_zombies_job``: the cleanup as ops, each a thin call into a step of ``zombie_pipeline.cleanup.run``.

The ops pass the run's :class:`~zombie_pipeline.cleanup.plan.CleanupPlan` along
(options, the policy in force, the generations decided) and work on the audit
collection, which is the cleanup's state: nothing else is shared between them.
"""

import datetime as dt
import time
from collections import Counter
from dataclasses import replace
from functools import partial
from typing import Any

import dagster as dg
from pydantic import Field

from zombie_pipeline import config, trail
from zombie_pipeline.cleanup import run
from zombie_pipeline.cleanup.compensations import CompensationError
from zombie_pipeline.cleanup.detection import Candidate
from zombie_pipeline.cleanup.plan import CleanupOptions, CleanupPlan
from zombie_pipeline.cleanup.results import Count
from zombie_pipeline.defs.metadata import (
    counts_metadata,
    malformed_metadata,
    table_metadata,
)
from zombie_pipeline.defs.pushgateway import MetricsGateway
from zombie_pipeline.defs.resources import Databases, ZombiePolicyResource
from zombie_pipeline.defs.tags import (
    CLEANUP_GROUP,
    JOB_TYPE_PARTITIONS,
    MAX_RETRIES_TAG,
    MAX_RUNTIME_TAG,
    PIPELINE_TAG,
    PRIORITY_TAG,
    QUEUE_DATABASE_TAG,
    RETRY_ON_STEP_FAILURE_TAG,
    RETRY_STRATEGY_TAG,
    scope_tags,
)
from zombie_pipeline.messages import counted
from zombie_pipeline.observability import metrics
from zombie_pipeline.queue.evidence import GenerationUnknown
from zombie_pipeline.queue.reasons import REASONS
from zombie_pipeline.queue.times import utc_now

#: A step that fails on an error that may pass (a server election, a dropped connection, a timeout) is tried again
#: within the run, after 2 s then 4 s: every step is safe to repeat (claims by unique id, compare-and-set, leases).
#: A refusal (the brake, a bad policy, an undecided generation, a broken compensation) is a ``dg.Failure`` with
#: ``allow_retries=False``: the same queue and configuration would give the same answer, so it fails at once.
TRANSIENT_RETRIES = dg.RetryPolicy(max_retries=2, delay=2, backoff=dg.Backoff.EXPONENTIAL)


class CleanupConfig(dg.Config):
    """Options of one cleanup run."""

    dry_run: bool = Field(default=False, description="List the zombies with their evidence; write nothing.")
    override_brake: bool = Field(
        default=False, description="Proceed even when the brake says too many started jobs look dead."
    )
    job_types: list[str] | None = Field(
        default=None, description="Only these job types (a partitioned run takes its partition's type)."
    )

    def options(self, context: dg.OpExecutionContext) -> CleanupOptions:
        if context.has_partition_key:
            job_types: tuple[str, ...] | None = tuple(context.partition_keys)
        else:
            job_types = tuple(self.job_types) if self.job_types is not None else None
        return CleanupOptions(dry_run=self.dry_run, override_brake=self.override_brake, job_types=job_types)


@dg.op(
    description="Tell the queue's generation, and complete the finalizations that crashed runs left half done.",
    retry_policy=TRANSIENT_RETRIES,
)
def plan_and_recover(
    context: dg.OpExecutionContext, config: CleanupConfig, databases: Databases, zombie_policy: ZombiePolicyResource
) -> CleanupPlan:
    source = zombie_policy.record_source(context)  # the run's tags say where its policy came from, even refused
    zombie_policy.policy()  # a refused value fails the run here, before the first command to a database
    with databases.store_for(
        context, "plan_and_recover: telling the generation and completing what crashed runs left"
    ) as store:
        policy = zombie_policy.in_force(store)
        try:
            prepared = run.prepare(store, policy, context.run_id, config.options(context))
        except (CompensationError, run.UnknownJobTypes) as error:  # refused before anything is written
            raise dg.Failure(
                description=str(error), metadata={"policy_source": source.describe()}, allow_retries=False
            ) from None
        plan = replace(prepared.plan, policy_source=source.describe())
        context.instance.add_run_tags(context.run_id, scope_tags(plan.options))
        if zombie_policy.use_suggested_max_durations:
            context.log.info(f"suggested maximum durations in force: {policy.max_duration_seconds_by_type}")
        metadata: dict[str, Any] = {
            **databases.describe(),
            "policy_source": source.describe(),
            "policy": dg.MetadataValue.json(policy.as_dict()),
            **{f"policy/{name}": value for name, value in policy.as_dict().items() if isinstance(value, (int, float))},
            "dry_run": plan.options.dry_run,
            "compensations": dg.MetadataValue.json(list(prepared.compensations)),
            "queue_generation": plan.generations.queue.name if plan.generations.queue else "undecided",
            "cache_generation": plan.generations.cache.name,
            "queue_generation_evidence": dg.MetadataValue.json(plan.generations.evidence()),
        }
        if plan.generations.problem:
            context.log.warning(plan.generations.problem)
        if prepared.unknown_override_types:
            metadata["unknown_override_types"] = dg.MetadataValue.json(list(prepared.unknown_override_types))
            context.log.warning(
                f"max_duration_seconds_by_type names job types this deployment has never had: "
                f"{list(prepared.unknown_override_types)}; their maximum duration applies to no job (a misspelt type?)"
            )
        result = run.reconcile(store, plan)
    metadata.update(counts_metadata(result.counts))
    if result.counts[Count.TAKEN_OVER]:
        context.log.warning(
            f"completed {counted(result.counts[Count.TAKEN_OVER], 'finalization')} left by crashed runs"
        )
    context.add_output_metadata(metadata)
    return plan.add(result)


@dg.op(
    description="Find started jobs past their heartbeat timeout, SIGTERM or maximum duration, in one indexed query.",
    retry_policy=TRANSIENT_RETRIES,
)
def find_zombies(
    context: dg.OpExecutionContext, plan: CleanupPlan, databases: Databases, metrics_gateway: MetricsGateway
) -> list[Candidate]:
    with databases.store_for(context, "find_zombies: detecting zombies") as store:
        detection = run.find(store, plan)
    brake = detection.brake
    pushed: dict[str, Any] = {}
    if not plan.options.dry_run:  # pushed when the brake stops the run too: that is when an operator must hear of it
        started = brake.started if brake is not None else None
        engaged = detection.stopped_by_brake
        stale_fraction = plan.policy.max_stale_fraction
        figures = partial(metrics.brake_figures, engaged, len(detection.candidates), started, stale_fraction)
        pushed = metrics_gateway.push(context, figures, databases.queue_database)
    if brake is not None and brake.engaged:  # the same queue would stop a retry too: failed at once, and only once
        raise dg.Failure(description=brake.message(), metadata=brake.facts(), allow_retries=False)
    rows = [candidate.row() for candidate in detection.candidates]
    by_reason = detection.count_by("reason")
    metadata: dict[str, Any] = {f"candidates/{reason}": by_reason.get(reason, 0) for reason in REASONS}
    metadata["candidates"] = len(rows)
    metadata["candidates_by_type"] = dg.MetadataValue.json(detection.count_by("job_type"))
    metadata["evidence"] = table_metadata(rows)
    metadata.update(malformed_metadata(detection.malformed))
    metadata.update(pushed)
    if detection.malformed:
        context.log.warning(f"{len(detection.malformed)} started jobs are malformed and were left alone")
    context.add_output_metadata(metadata)
    if plan.options.dry_run:
        context.log.info(f"dry run: {counted(len(rows), 'zombie')} would be finalized; nothing written")
        return []
    return detection.candidates


@dg.op(
    description="Claim each zombie in the audit trail, then finish it as the queue's generation does (set to error, "
    "or error entry then deletion), by compare-and-set, with the deployment's counters, rate limiter and locks; "
    "write the error users see; re-enqueue within the retry limits where the generation wants it.",
    retry_policy=TRANSIENT_RETRIES,
)
def finalize_zombies(
    context: dg.OpExecutionContext, plan: CleanupPlan, candidates: list[Candidate], databases: Databases
) -> CleanupPlan:
    try:
        with databases.store_for(context, "finalize_zombies: claiming and finalizing zombies") as store:
            result = run.claim_and_finalize(store, plan, candidates)
    except GenerationUnknown as error:
        raise dg.Failure(
            description=str(error),
            metadata={
                "zombies_found": len(candidates),
                "queue_generation_candidates": dg.MetadataValue.json(list(plan.generations.queue_verdict.candidates)),
                "to_decide": "set queue_generation in the zombie_policy resource",
            },
            allow_retries=False,
        ) from None
    context.add_output_metadata({**counts_metadata(result.counts), "finalized_jobs": table_metadata(result.rows)})
    found = Counter((candidate.job_type, str(candidate.reason)) for candidate in candidates)
    return replace(
        plan.add(result), found=tuple((job_type, reason, count) for (job_type, reason), count in sorted(found.items()))
    )


@dg.op(
    description="Run each finalized zombie's compensations (actions that undo a job's partial side effects), the ones "
    "failing in earlier runs too; record every outcome on its event. A failure never stops the others.",
    retry_policy=TRANSIENT_RETRIES,
)
def compensate_zombies(context: dg.OpExecutionContext, plan: CleanupPlan, databases: Databases) -> CleanupPlan:
    with databases.store_for(context, "compensate_zombies: running compensations") as store:
        result = run.compensate(store, plan)
    context.add_output_metadata(counts_metadata(result.counts))
    if result.counts[Count.COMPENSATION_FAILED] or result.counts[Count.COMPENSATION_TO_RETRY]:
        context.log.warning(
            f"compensations: {result.counts[Count.COMPENSATION_TO_RETRY]} failed and will be tried again, "
            f"{result.counts[Count.COMPENSATION_FAILED]} given up on (see the compensations_succeed check)"
        )
    return plan.add(result)


@dg.op(
    description="Look for life in the jobs finalized in the last late_result_window_hours (a heartbeat, their own "
    "result over our error): each one is a late result, a mistake recorded once on its event and counted.",
    retry_policy=TRANSIENT_RETRIES,
)
def find_late_results(context: dg.OpExecutionContext, plan: CleanupPlan, databases: Databases) -> CleanupPlan:
    with databases.store_for(context, "find_late_results: looking for life in finalized jobs") as store:
        result = run.audit(store, plan)
    context.add_output_metadata(counts_metadata(result.counts))
    if result.counts[Count.LATE_RESULTS]:
        context.log.warning(
            f"{result.counts[Count.LATE_RESULTS]} finalized jobs showed life afterwards (late results: their events "
            "say what showed it; docs/detection.md)"
        )
    return plan.add(result)


@dg.op(
    description="Summarize the run from the audit trail: what was finalized, why, and what was skipped; push the "
    "figures to the Pushgateway, if there is one.",
    retry_policy=TRANSIENT_RETRIES,
)
def report_cleanup(
    context: dg.OpExecutionContext, plan: CleanupPlan, databases: Databases, metrics_gateway: MetricsGateway
) -> dict[str, int]:
    with databases.store_for(context, "report_cleanup: reading the run back from the audit trail") as store:
        summary = run.summarize(store, plan.run_id, dict(plan.counts), plan.policy_source)
        metadata: dict[str, Any] = {
            "policy_source": plan.policy_source,
            **counts_metadata(summary.counts),
            "finalized_jobs": table_metadata(summary.rows),
            "summary": dg.MetadataValue.md(summary.markdown()),
        }
        if not plan.options.dry_run:
            found = {(job_type, reason): count for job_type, reason, count in plan.found}

            def figures() -> metrics.Figures:  # read only when there is a gateway to push to
                totals = trail.audit_totals(store.events, metrics.DETECTION_BUCKETS, metrics.RELEASE_LAG_BUCKETS)
                return metrics.cleanup_figures(
                    totals,
                    summary.counts,
                    found,
                    plan.started_at,
                    utc_now(),
                    heartbeat_timeout_seconds=plan.policy.heartbeat_timeout_seconds,
                )

            metadata.update(metrics_gateway.push(context, figures, databases.queue_database))
    context.add_output_metadata(metadata)
    context.log.info(summary.one_line())
    return dict(summary.counts)


#: A cleanup's runtime limit (its dagster/max_runtime tag): some 14 times what a whole run cleaning 1,000 zombies takes
#: on the embedded server (21.5 s measured, docs/deploy.md).
CLEANUP_MAX_RUNTIME_SECONDS = 300


@dg.job(
    description=(
        "Find zombie jobs (started, worker gone or running past its maximum duration), finalize each exactly "
        "once as the queue's generation does, without clobbering a live worker, write the error users see into "
        "the cache, keep the deployment's counters, rate limiter and locks in step, re-enqueue within the retry "
        "limits (at once or after a backoff), run the compensations of each job type, and record everything in the "
        "zombieEvents audit trail."
    ),
    partitions_def=JOB_TYPE_PARTITIONS,
    executor_def=dg.in_process_executor,  # six short steps: one process, not six imports of Dagster
    # Read by the production instance (deploy/dagster.yaml); in-process executions ignore them.
    tags={
        PIPELINE_TAG: CLEANUP_GROUP,
        # One cleanup per queue database at a time (a tag concurrency limit on this key), whoever launched it.
        QUEUE_DATABASE_TAG: config.queue_database(),
        # Ahead of statistics runs waiting for a slot in the run queue.
        PRIORITY_TAG: "10",
        # The zombie killer must not become a zombie: a cleanup takes seconds (a fixed number of commands per
        # batch; a run of 1,000 zombies in about 21.5 s on the embedded server), so after 5 minutes run monitoring fails it
        # and, its worker lost or stuck, the run is retried and the queue's slot freed (docs/deploy.md, "Crashes").
        MAX_RUNTIME_TAG: str(CLEANUP_MAX_RUNTIME_SECONDS),
        # A run lost with its worker (a crash, the runtime limit) is retried twice, from the start: safe because
        # a cleanup is idempotent. Each zombie is claimed by inserting its audit event (_id = job _id) and
        # finished by compare-and-set on what detection saw, so a retry can neither finalize a job twice nor
        # overwrite a live worker; what a dead run left half done is completed once its lease expires.
        # ALL_STEPS: the retry re-reads the queue rather than trust candidates a failed run detected minutes ago.
        MAX_RETRIES_TAG: "2",
        RETRY_STRATEGY_TAG: "ALL_STEPS",
        # A run whose step failed is not: the step already had its own retries (TRANSIENT_RETRIES) if the error
        # could pass, and a refusal (the brake, a bad policy) would only be refused again, and reported again.
        RETRY_ON_STEP_FAILURE_TAG: "false",
    },
)
def kill_zombies_job() -> None:
    plan = plan_and_recover()
    report_cleanup(find_late_results(compensate_zombies(finalize_zombies(plan, find_zombies(plan)))))


#: A cleanup in these states holds (or waits for) its queue database's slot in the run queue.
IN_FLIGHT_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
#: Of those, the states of a cleanup that has not started yet: it holds the ticks back only for the start timeout.
WAITING_STATUSES = frozenset(
    {dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING}
)


def cleanup_in_flight(
    instance: dg.DagsterInstance, queue_database: str | None = None, now: float | None = None
) -> dg.RunRecord | None:
    """The newest cleanup of ``queue_database`` (default: this location's) that holds the ticks back, if any.

    The schedule and the sensor ask for no cleanup while there is one: it would only wait behind it in the run
    queue (one cleanup per queue database), and a run stuck until its runtime limit would leave a backlog that
    then runs as a burst. A running (or canceling) cleanup holds them back until it ends, which run monitoring
    bounds (its ``dagster/max_runtime``, the cancel timeout). One that has not started (:data:`WAITING_STATUSES`)
    holds them back for the instance's start timeout only (:func:`start_timeout_seconds`), counted from when it began
    to wait in its state (:func:`waiting_since`): past it, its launch failed or hangs (a code server that does not
    answer), run monitoring fails it if it is STARTING, and a tick asks for a cleanup again, which the run queue
    launches once the slot is free.
    """
    database = queue_database or kill_zombies_job.tags[QUEUE_DATABASE_TAG]
    records = instance.get_run_records(
        dg.RunsFilter(job_name=kill_zombies_job.name, statuses=IN_FLIGHT_STATUSES, tags={QUEUE_DATABASE_TAG: database}),
        limit=20,
    )
    moment = time.time() if now is None else now
    timeout = start_timeout_seconds(instance)
    for record in records:
        if record.dagster_run.status not in WAITING_STATUSES or moment - waiting_since(instance, record) < timeout:
            return record
    return None


def start_timeout_seconds(instance: dg.DagsterInstance) -> int:
    """How long a run may take to start: run monitoring's ``start_timeout_seconds`` of the instance, else Dagster's
    default (180 s). The same whether monitoring is on or not: the ticks are never held longer by a run that does
    not start."""
    return instance.run_monitoring_start_timeout_seconds


def waiting_since(instance: dg.DagsterInstance, record: dg.RunRecord) -> float:
    """When a cleanup that has not started entered its state: its launch (STARTING), its enqueueing (QUEUED), its
    creation (NOT_STARTED, or whenever the event log says nothing), as run monitoring counts its start timeout."""
    stats = instance.get_run_stats(record.dagster_run.run_id)
    entered = {dg.DagsterRunStatus.STARTING: stats.launch_time, dg.DagsterRunStatus.QUEUED: stats.enqueued_time}
    moment = entered.get(record.dagster_run.status)
    return moment if moment is not None else record.create_timestamp.timestamp()


def in_flight_reason(record: dg.RunRecord, instance: dg.DagsterInstance) -> str:
    """Why a tick asks for nothing, naming the run, its queue database, its state, since when and until when at most."""
    run = record.dagster_run
    if run.status in WAITING_STATUSES:
        waiting = waiting_since(instance, record)
        since = dt.datetime.fromtimestamp(waiting, dt.UTC)
        bound = (
            f"it holds the ticks back {start_timeout_seconds(instance)} s at most (the instance's start timeout), "
            "then run monitoring fails it if it is starting"
        )
    else:
        since = dt.datetime.fromtimestamp(record.start_time or record.create_timestamp.timestamp(), dt.UTC)
        bound = f"a run stuck longer than its {run.tags.get(MAX_RUNTIME_TAG, '?')} s limit is failed by run monitoring"
    return (
        f"cleanup run {run.run_id} of queue database {run.tags.get(QUEUE_DATABASE_TAG)!r} is "
        f"{run.status.value.lower()} since {since:%Y-%m-%d %H:%M:%S} UTC; {bound}"
    )
