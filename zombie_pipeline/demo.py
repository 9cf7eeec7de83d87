"""``zombie-pipeline demo``: the whole pipeline on the embedded default, in one command."""

from __future__ import annotations

import os
import time

import dagster as dg

from zombie_pipeline.cleanup import summarize_run
from zombie_pipeline.detection import count_stale
from zombie_pipeline.orchestration.jobs import kill_zombies_job
from zombie_pipeline.orchestration.resources import resources_from_env, store_of
from zombie_pipeline.simulate import Workload, simulate, utc_now


def _instance() -> dg.DagsterInstance:
    """The Dagster instance of ``$DAGSTER_HOME`` (runs then show in the UI), else a throwaway one."""
    if os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.get()
    return dg.DagsterInstance.ephemeral()


def run_demo(finished: int = 3_000, seed: int = 0, fresh: bool = False) -> int:
    resources = resources_from_env()
    queue_db, cache_db, policy_resource = resources["queue_db"], resources["cache_db"], resources["zombie_policy"]
    real_database = queue_db.url() is not None or cache_db.url() is not None
    store = store_of(queue_db, cache_db)
    policy = policy_resource.policy()
    print(f"queue: {queue_db.describe()}\ncache: {cache_db.describe()}")

    if real_database:
        print("A MongoDB URL is set: the demo simulates nothing and runs the cleanup as a dry run.")
    else:
        if fresh:
            for collection in (store.jobs, store.cache, store.events):
                collection.drop()
        store.ensure_indexes()
        _fill(store, finished, seed, policy)

    run_config = {
        "ops": {"reconcile": {"config": {"dry_run": real_database}}},
        "loggers": {"console": {"config": {"log_level": "WARNING"}}},  # the summary below says it all
    }
    started = time.monotonic()
    with _instance() as instance:
        result = kill_zombies_job.execute_in_process(
            run_config=run_config, resources=resources, instance=instance, raise_on_error=False
        )
    seconds = time.monotonic() - started
    print(f"\nkill_zombies_job: {'succeeded' if result.success else 'FAILED'} in {seconds:.1f} s (run {result.run_id[:8]})")
    if not result.success:
        failure = next((e for e in result.all_events if e.is_step_failure), None)
        if failure is not None and failure.step_failure_data.error is not None:
            print("  " + failure.step_failure_data.error.message.strip().splitlines()[-1])
        print("  (start from a fresh simulated queue with: zombie-pipeline demo --fresh)")
        return 1
    summary = summarize_run(store, result.run_id, result.output_for_node("summarize"))
    print("  " + summary.one_line())
    for row in summary.rows[:8]:
        print(f"  - {row['type']:<32} {row['dataset']:<28} {row['reason']:<22} ran {row['ran_seconds']:>7.0f} s")
    if len(summary.rows) > 8:
        print(f"  ... and {len(summary.rows) - 8} more (see the run's metadata in the Dagster UI)")
    print(f"  zombies left: {count_stale(store.jobs, policy, utc_now())}")
    print(f"  audit trail: {store.events.count_documents({})} events in {store.events.full_name}")
    return 0


def _fill(store, finished: int, seed: int, policy) -> None:
    """Simulate a deployment into an empty queue; top up with new zombies once they are all cleaned."""
    if store.jobs.estimated_document_count() == 0:
        workload = Workload(finished=finished, seed=seed)
        print(f"empty queue: simulating {workload.total} jobs over {workload.days:.0f} days ...")
    elif count_stale(store.jobs, policy, utc_now()) == 0:
        workload = Workload(finished=0, waiting=0, running=60, seed=seed + 1 + store.events.count_documents({}))
        print("no zombies left from earlier demos: simulating workers that crashed since ...")
    else:
        return
    simulate(
        store.jobs.database,
        store.cache.database,
        workload,
        jobs_collection=store.jobs.name,
        cache_collection=store.cache.name,
    )

