"""``kill_zombies_job``: the cleanup as ops, each a thin call into ``zombie_pipeline.cleanup``.

The ops pass a :class:`CleanupPlan` along (run options, the policy and the
queue's generation) and work on the audit collection, which is the cleanup's
state: with the multiprocess executor nothing is shared in memory between ops.
"""


import datetime as dt
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Optional

import dagster as dg
from pydantic import Field

from zombie_pipeline import cleanup, compensations, config, metrics
from zombie_pipeline.cleanup import GenerationUnknown
from zombie_pipeline.detection import Candidate, brake_for, unknown_job_types
from zombie_pipeline.documents import REASONS, utc_now
from zombie_pipeline.events import StepResult
from zombie_pipeline.generations import QUEUE_GENERATIONS, QueueVerdict
from zombie_pipeline.orchestration.metadata import counts_metadata, malformed_metadata, table_metadata
from zombie_pipeline.orchestration.metrics import MetricsGateway
from zombie_pipeline.orchestration.resources import CacheDatabase, QueueDatabase, ZombiePolicyResource, store_of
from zombie_pipeline.orchestration.tags import (
    CLEANUP_GROUP,
    JOB_TYPE_PARTITIONS,
    MAX_RETRIES_TAG,
    MAX_RUNTIME_TAG,
    PIPELINE_TAG,
    PRIORITY_TAG,
    QUEUE_DATABASE_TAG,
    RETRY_STRATEGY_TAG,
)
from zombie_pipeline.policy import ZombiePolicy


class CleanupConfig(dg.Config):
    """Options of one cleanup run."""

    dry_run: bool = Field(default=False, description="List the zombies with their evidence; write nothing.")
    override_brake: bool = Field(
        default=False, description="Proceed even when the brake says too many started jobs look dead."
    )
    job_types: Optional[list[str]] = Field(
        default=None, description="Only these job types (a partitioned run takes its partition's type)."
    )


@dataclass(frozen=True)
class CleanupPlan:
    run_id: str
    policy: ZombiePolicy
    dry_run: bool
    override_brake: bool
    job_types: Optional[tuple[str, ...]]
    started_at: dt.datetime
    generation: Optional[str]  # None: undecided, and ``generation_problem`` says why
    generation_problem: Optional[str] = None
    generation_candidates: tuple[str, ...] = ()  # the generations the evidence leaves open
    counts: tuple[tuple[str, int], ...] = ()  # what the steps so far did
    found: tuple[tuple[str, str, int], ...] = ()  # (job type, reason, zombies) as detection returned them

    def add(self, result: StepResult) -> "CleanupPlan":
        merged = Counter(dict(self.counts))
        merged.update(result.counts)
        return replace(self, counts=tuple(sorted(merged.items())))


def _job_types(context: dg.OpExecutionContext, config: CleanupConfig) -> Optional[tuple[str, ...]]:
    if context.has_partition_key:
        return tuple(context.partition_keys)
    return tuple(config.job_types) if config.job_types is not None else None


def _generation_metadata(verdict: QueueVerdict) -> dict[str, Any]:
    return {
        "queue_generation": verdict.generation.name if verdict.generation else "undecided",
        "queue_generation_evidence": dg.MetadataValue.json(verdict.evidence()),
    }


@dg.op(description="Tell the queue's generation, and complete the finalizations that crashed runs left half done.")
def reconcile(
    context: dg.OpExecutionContext,
    config: CleanupConfig,
    queue_db: QueueDatabase,
    cache_db: CacheDatabase,
    zombie_policy: ZombiePolicyResource,
) -> CleanupPlan:
    store = store_of(queue_db, cache_db, check=True)
    policy = zombie_policy.in_force(store)
    try:
        actions = compensations.registry(policy)
    except compensations.CompensationError as error:  # refused before anything is written
        raise dg.Failure(description=str(error)) from None
    if zombie_policy.use_suggested_max_durations:
        context.log.info(f"suggested maximum durations in force: {policy.max_duration_seconds_by_type}")
    verdict = cleanup.queue_verdict(store, policy)
    plan = CleanupPlan(
        run_id=context.run_id,
        policy=policy,
        dry_run=config.dry_run,
        override_brake=config.override_brake,
        job_types=_job_types(context, config),
        started_at=utc_now(),
        generation=verdict.generation.name if verdict.generation else None,
        generation_problem=verdict.problem,
        generation_candidates=verdict.candidates,
    )
    metadata: dict[str, Any] = {
        "queue": queue_db.describe(),
        "cache": cache_db.describe(),
        "policy": dg.MetadataValue.json(plan.policy.as_dict()),
        **{f"policy/{name}": value for name, value in plan.policy.as_dict().items() if isinstance(value, (int, float))},
        "dry_run": plan.dry_run,
        "compensations": dg.MetadataValue.json([action.name for action in actions]),
        **_generation_metadata(verdict),
    }
    if verdict.problem:
        context.log.warning(verdict.problem)
    unknown = unknown_job_types(store.jobs, zombie_policy.max_duration_seconds_by_type)
    if unknown:
        metadata["unknown_override_types"] = dg.MetadataValue.json(unknown)
        context.log.warning(
            f"max_duration_seconds_by_type names job types the queue does not hold: {unknown}; "
            "their maximum duration applies to no job (a misspelt type?)"
        )
    if not plan.dry_run:
        if verdict.generation is not None:
            store.ensure_indexes()
        result = cleanup.reconcile(store, plan.run_id, plan.policy)
        plan = plan.add(result)
        metadata.update(counts_metadata(result.counts))
        if result.counts["taken_over"]:
            context.log.warning(f"completed {result.counts['taken_over']} finalizations left by crashed runs")
    context.add_output_metadata(metadata)
    return plan


@dg.op(description="Find started jobs past their heartbeat timeout, SIGTERM or maximum duration, in one indexed query.")
def find_zombies(
    context: dg.OpExecutionContext, plan: CleanupPlan, queue_db: QueueDatabase, cache_db: CacheDatabase, metrics_gateway: MetricsGateway
) -> list[Candidate]:
    store = store_of(queue_db, cache_db, check=True)
    # The brake applied here rather than inside cleanup.find_zombies: its numbers become the failure's metadata.
    detection = cleanup.find_zombies(store, plan.policy, None, plan.job_types, override_brake=True)
    brake = None if plan.override_brake or not detection.candidates else brake_for(store.jobs, detection, plan.policy, plan.job_types)
    engaged = brake is not None and brake.engaged
    pushed: dict[str, Any] = {}
    if not plan.dry_run:  # pushed when the brake stops the run too: that is when an operator must hear of it
        started = brake.started if brake is not None else None
        figures = partial(metrics.brake_figures, engaged, len(detection.candidates), started, plan.policy.max_stale_fraction)
        pushed = metrics_gateway.push(context, figures, queue_db.database)
    if engaged:
        raise dg.Failure(description=brake.message(), metadata=brake.facts())
    rows = [candidate.evidence() for candidate in detection.candidates]
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
    if plan.dry_run:
        context.log.info(f"dry run: {len(rows)} zombies would be finalized; nothing written")
        return []
    return detection.candidates


@dg.op(
    description="Claim each zombie in the audit trail, then finish it as the queue's generation does (set to error, "
    "or error entry then deletion), by compare-and-set, with the deployment's counters, rate limiter and locks; "
    "write the error users see; re-enqueue within the retry limits where the generation wants it."
)
def finalize_zombies(
    context: dg.OpExecutionContext, plan: CleanupPlan, candidates: list[Candidate], queue_db: QueueDatabase, cache_db: CacheDatabase
) -> CleanupPlan:
    store = store_of(queue_db, cache_db, check=True)
    if candidates and plan.generation is None:
        raise dg.Failure(
            description=str(GenerationUnknown(plan.generation_problem)),
            metadata={
                "zombies_found": len(candidates),
                "queue_generation_candidates": dg.MetadataValue.json(list(plan.generation_candidates)),
                "to_decide": "set queue_generation in the zombie_policy resource",
            },
        )
    result = StepResult()
    if candidates:
        generation = QUEUE_GENERATIONS[plan.generation]
        result = cleanup.finalize_zombies(store, candidates, plan.policy, plan.run_id, utc_now(), generation)
    context.add_output_metadata({**counts_metadata(result.counts), "finalized_jobs": table_metadata(result.rows)})
    found = Counter((candidate.job_type, str(candidate.reason)) for candidate in candidates)
    return replace(plan.add(result), found=tuple((job_type, reason, count) for (job_type, reason), count in sorted(found.items())))


@dg.op(
    description="Run each finalized zombie's compensations (actions that undo a job's partial side effects), the ones "
    "failing in earlier runs too; record every outcome on its event. A failure never stops the others."
)
def compensate_zombies(context: dg.OpExecutionContext, plan: CleanupPlan, queue_db: QueueDatabase, cache_db: CacheDatabase) -> CleanupPlan:
    if plan.dry_run:
        return plan
    store = store_of(queue_db, cache_db, check=True)
    result = compensations.compensate(store, plan.policy, plan.run_id, compensations.registry(plan.policy))
    context.add_output_metadata(counts_metadata(result.counts))
    if result.counts["compensation_failed"] or result.counts["compensation_to_retry"]:
        context.log.warning(
            f"compensations: {result.counts['compensation_to_retry']} failed and will be tried again, "
            f"{result.counts['compensation_failed']} given up on (see the compensations_succeed check)"
        )
    return plan.add(result)


@dg.op(
    description="Summarize the run from the audit trail: what was finalized, why, and what was skipped; push the "
    "figures to the Pushgateway, if there is one."
)
def summarize(
    context: dg.OpExecutionContext, plan: CleanupPlan, queue_db: QueueDatabase, cache_db: CacheDatabase, metrics_gateway: MetricsGateway
) -> dict:
    store = store_of(queue_db, cache_db, check=True)
    summary = cleanup.summarize_run(store, plan.run_id, dict(plan.counts))
    metadata: dict[str, Any] = {
        **counts_metadata(summary.counts),
        "finalized_jobs": table_metadata(summary.rows),
        "summary": dg.MetadataValue.md(summary.markdown()),
    }
    if not plan.dry_run:
        found = {(job_type, reason): count for job_type, reason, count in plan.found}

        def figures() -> metrics.Figures:  # read only when there is a gateway to push to
            return metrics.cleanup_figures(metrics.audit_totals(store.events), summary.counts, found, plan.started_at, utc_now())

        metadata.update(metrics_gateway.push(context, figures, queue_db.database))
    context.add_output_metadata(metadata)
    context.log.info(summary.one_line())
    return dict(summary.counts)


@dg.job(
    description=(
        "Find zombie jobs (started, worker gone or running past its maximum duration), finalize each exactly "
        "once as the queue's generation does, without clobbering a live worker, write the error users see into "
        "the cache, keep the deployment's counters, rate limiter and locks in step, re-enqueue within the retry "
        "limits (at once or after a backoff), run the compensations of each job type, and record everything in the "
        "zombieEvents audit trail."
    ),
    partitions_def=JOB_TYPE_PARTITIONS,
    executor_def=dg.in_process_executor,  # five short steps: one process, not five imports of Dagster
    # Read by the production instance (deploy/dagster.yaml); in-process executions ignore them.
    tags={
        PIPELINE_TAG: CLEANUP_GROUP,
        # One cleanup per queue database at a time (a tag concurrency limit on this key), whoever launched it.
        QUEUE_DATABASE_TAG: config.queue_database(),
        # Ahead of statistics runs waiting for a slot in the run queue.
        PRIORITY_TAG: "10",
        # The zombie killer must not become a zombie: a cleanup takes seconds (a fixed number of commands per
        # batch), so after 15 minutes run monitoring fails it and stops its worker; the next tick starts afresh.
        MAX_RUNTIME_TAG: "900",
        # Retried twice, from the start, when it fails: safe because a cleanup is idempotent. Each zombie is
        # claimed by inserting its audit event (_id = job _id) and finished by compare-and-set on what
        # detection saw, so a retry can neither finalize a job twice nor overwrite a live worker; what a dead
        # run left half done is completed once its lease expires. ALL_STEPS: the retry re-reads the queue
        # rather than trust candidates a failed run detected minutes ago.
        MAX_RETRIES_TAG: "2",
        RETRY_STRATEGY_TAG: "ALL_STEPS",
    },
)
def kill_zombies_job():
    plan = reconcile()
    summarize(compensate_zombies(finalize_zombies(plan, find_zombies(plan))))
