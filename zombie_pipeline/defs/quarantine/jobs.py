"""``lift_quarantine_job``: an operator lifts the quarantine of one (dataset, job type) from the Launchpad.

A thin op around ``zombie_pipeline.cleanup.quarantine.lift``: the quarantine ends now, and the jobs it withheld
whose error users still read are re-enqueued (as retries due now, which the same step enqueues). A pair that is
not quarantined is refused in one line naming the ones that are, before anything is written, and never retried.
"""

from typing import Any

import dagster as dg
from pydantic import Field

from zombie_pipeline.cleanup import quarantine
from zombie_pipeline.cleanup.results import Count
from zombie_pipeline.defs.resources import Databases, ZombiePolicyResource
from zombie_pipeline.defs.tags import CLEANUP_GROUP, PIPELINE_TAG
from zombie_pipeline.queue.times import utc_now


class LiftQuarantineConfig(dg.Config):
    """Which quarantine to lift."""

    dataset: str = Field(description="The dataset, as the queue names it (e.g. user/name).")
    job_type: str = Field(description="The job type (the cache's kind), e.g. /first-rows or split-first-rows.")


@dg.op(
    description="Lift the quarantine of one (dataset, job type): its crashes are re-enqueued again, and the jobs it "
    "withheld whose error users still read run again now. Refused, in one line, when the pair is not quarantined.",
)
def lift_quarantine(
    context: dg.OpExecutionContext,
    config: LiftQuarantineConfig,
    databases: Databases,
    zombie_policy: ZombiePolicyResource,
) -> dict[str, Any]:
    zombie_policy.record_source(context)
    zombie_policy.policy()  # a refused value fails the run here, before the first command to a database
    with databases.store_for(context, "lift_quarantine: lifting a quarantine") as store:
        try:
            lifted = quarantine.lift(
                store, zombie_policy.in_force(store), config.dataset, config.job_type, context.run_id, utc_now()
            )
        except quarantine.NotQuarantined as error:  # the same request would be refused again: no retry
            asked = {"dataset": config.dataset, "job_type": config.job_type}
            raise dg.Failure(description=str(error), metadata=asked, allow_retries=False) from None
    metadata: dict[str, Any] = {
        "dataset": lifted.dataset,
        "job_type": lifted.job_type,
        "withheld_jobs_rerun": lifted.scheduled,
        "enqueued": lifted.counts.get(Count.DUE_RETRY_ENQUEUED, 0),
        "already_queued": lifted.counts.get(Count.DUE_RETRY_ALREADY_QUEUED, 0),
    }
    context.add_output_metadata(metadata)
    context.log.info(
        f"quarantine of {lifted.dataset} {lifted.job_type} lifted; {lifted.scheduled} withheld jobs re-run "
        f"({metadata['enqueued']} enqueued now, {metadata['already_queued']} already waiting or running)"
    )
    return metadata


@dg.job(
    description="Lift the quarantine of a (dataset, job type) whose jobs kept crashing their workers (config: dataset, "
    "job_type): the jobs it withheld run again, and its crashes are retried again. A quarantine also lapses by itself "
    "after the policy's quarantine_lapse_hours.",
    tags={PIPELINE_TAG: CLEANUP_GROUP},
    executor_def=dg.in_process_executor,
)
def lift_quarantine_job() -> None:
    lift_quarantine()
