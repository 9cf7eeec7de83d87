"""``zombie-pipeline demo``: the whole pipeline on the embedded default, in one command."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from pathlib import Path

import dagster as dg

from zombie_pipeline import config
from zombie_pipeline.cleanup import summarize_run
from zombie_pipeline.detection import count_stale
from zombie_pipeline.documents import utc_now
from zombie_pipeline.orchestration.cleanup import kill_zombies_job
from zombie_pipeline.orchestration.resources import resources_from_env, store_of
from zombie_pipeline.orchestration.statistics import job_duration_statistics, job_duration_tallies
from zombie_pipeline.cleanup import queue_verdict, required_generation
from zombie_pipeline.generations import NEWEST_QUEUE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.workers import WorkerPool, WorkerRates
from zombie_pipeline.simulate import Workload, drop_simulation, simulate, simulated_generation
from zombie_pipeline.statistics.reports import ReportFiles, summary_text
from zombie_pipeline.statistics.suggest import DEFAULT_WINDOW_DAYS, analyze_window


QUIET = {"console": {"config": {"log_level": "WARNING"}}}  # the summary printed says it all


def _instance() -> dg.DagsterInstance:
    """The Dagster instance of ``$DAGSTER_HOME`` (runs then show in the UI), else a throwaway one."""
    if config.dagster_home_is_set():
        return dg.DagsterInstance.get()
    return dg.DagsterInstance.ephemeral()


def run_demo(finished: int = 3_000, seed: int = 0, fresh: bool = False, generation: str = NEWEST_QUEUE_GENERATION) -> int:
    resources = resources_from_env()
    queue_db, cache_db, policy_resource = resources["queue_db"], resources["cache_db"], resources["zombie_policy"]
    real_database = queue_db.url() is not None or cache_db.url() is not None
    store = store_of(queue_db, cache_db)
    policy = policy_resource.policy()
    print(f"queue: {queue_db.describe()}\ncache: {cache_db.describe()}")

    if real_database:
        print("A MongoDB URL is set: the demo simulates nothing and writes nothing (the cleanup runs as a dry run).")
    else:
        if fresh or simulated_generation(store) not in (None, generation):
            drop_simulation(store)
        store.ensure_indexes()
        _fill(store, finished, seed, policy, generation)

    run_config = {
        "ops": {"reconcile": {"config": {"dry_run": real_database}}},
        "loggers": QUIET,
    }
    with _living_queue(store, generation, policy, seed, enabled=not real_database):
        return _run_pipeline(store, resources, run_config, policy, real_database)


@contextlib.contextmanager
def _living_queue(store, generation: str, policy, seed: int, enabled: bool):
    """Simulated workers take waiting jobs, heartbeat and finish while the demo runs; stopped, they finish what they hold."""
    if not enabled:
        yield None
        return
    pool = WorkerPool(store, QUEUE_GENERATIONS[generation], policy, WorkerRates(crash_rate=0.0), seed=seed)
    pool.adopt_running()
    stopping = threading.Event()
    thread = threading.Thread(target=pool.run, args=(3_600, stopping.is_set), daemon=True, name="simulated-workers")
    thread.start()
    try:
        yield pool
    finally:
        stopping.set()
        thread.join(timeout=60)
        print(f"\nsimulated workers: {_worker_line(pool.counts)}")


def _worker_line(counts) -> str:
    return ", ".join(f"{count} {name.replace('_', ' ')}" for name, count in sorted(counts.items())) or "nothing to do"


def _run_pipeline(store, resources, run_config, policy, real_database: bool) -> int:
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
        if not real_database:
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

    try:
        files, window_end = _materialize_statistics(resources, _instance, save_suggestions=not real_database)
    except dg.DagsterExecutionStepExecutionError as error:
        print(f"\nduration_statistics: not computed: {error.user_exception}")
        return 0
    print(f"\nduration_statistics for the {DEFAULT_WINDOW_DAYS} days to {window_end:%Y-%m-%d %H:%M} UTC:")
    verdict = queue_verdict(store, policy)
    report = analyze_window(store, required_generation(verdict), policy, end=window_end)  # the asset's figures, for the terminal
    print(summary_text(report, files))
    return 0


def _materialize_statistics(resources, instance_factory, save_suggestions: bool) -> tuple[ReportFiles, dt.datetime]:
    """The statistics assets through Dagster: each day of the window, then the window's report.

    Daily partitions are whole UTC days, so the window ends at midnight, with yesterday.
    """
    # ERROR: the window's unused days (its mapping spans 28) would each log a warning
    run_config: dict = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
    statistics_config = {**run_config, "ops": {job_duration_statistics.op.name: {"config": {"save_suggestions": save_suggestions}}}}
    window_end = dt.datetime.combine(utc_now().date(), dt.time(), tzinfo=dt.timezone.utc)
    days = [(window_end - dt.timedelta(days=n)).date().isoformat() for n in range(DEFAULT_WINDOW_DAYS, 0, -1)]
    with instance_factory() as instance:
        for day in days:
            dg.materialize(
                [job_duration_tallies], partition_key=day, resources=resources, instance=instance, run_config=run_config
            )
        result = dg.materialize(
            [job_duration_tallies, job_duration_statistics],
            selection=[job_duration_statistics],
            partition_key=days[-1],
            resources=resources,
            instance=instance,
            run_config=statistics_config,
        )
    [materialization] = result.asset_materializations_for_node(job_duration_statistics.op.name)
    paths = {name: Path(materialization.metadata[name].value) for name in ("csv", "json", "chart", "markdown")}
    return ReportFiles(**paths), window_end


def _fill(store, finished: int, seed: int, policy, generation: str) -> None:
    """Simulate a deployment into an empty queue; top up with new zombies once they are all cleaned."""
    if simulated_generation(store) is None:
        workload = Workload(finished=finished, seed=seed, generation=generation)
        print(f"empty queue: simulating a {generation} deployment, {workload.total} jobs over {workload.days:.0f} days ...")
    elif count_stale(store.jobs, policy, utc_now()) == 0:
        workload = Workload(finished=0, waiting=20, running=40, seed=seed, generation=generation)
        print("no zombies left from earlier demos: simulating workers that crashed since ...")
    else:
        return
    simulate(store, workload)

