"""``zombie-pipeline demo``: the whole pipeline on the embedded default, in one command."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg

from zombie_pipeline import config
from zombie_pipeline.cleanup.detection import count_stale
from zombie_pipeline.cleanup.run import summarize
from zombie_pipeline.orchestration.cleanup import kill_zombies_job
from zombie_pipeline.orchestration.resources import (
    check_databases,
    resources_from_env,
    store_of,
)
from zombie_pipeline.orchestration.statistics import (
    job_duration_statistics,
    job_duration_tallies,
)
from zombie_pipeline.queue.documents import utc_now
from zombie_pipeline.queue.evidence import decide
from zombie_pipeline.queue.generations import NEWEST_QUEUE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.simulation.simulator import (
    Workload,
    check_ours,
    drop_simulation,
    simulate,
    simulated_generation,
)
from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates
from zombie_pipeline.statistics.analysis import DEFAULT_WINDOW_DAYS, analyze_window
from zombie_pipeline.statistics.reports import ReportFiles, summary_text

#: Dagster's console logger silenced: the demo prints its own summary, and a failure as its one line, never a stack trace.
QUIET = {"console": {"config": {"log_level": "CRITICAL"}}}


def _instance() -> dg.DagsterInstance:
    """The Dagster instance of ``$DAGSTER_HOME`` (runs then show in the UI), else a throwaway one."""
    if config.dagster_home_is_set():
        return dg.DagsterInstance.get()
    return dg.DagsterInstance.ephemeral()


def run_demo(
    finished: int = 3_000,
    seed: int = 0,
    fresh: bool = False,
    generation: str = NEWEST_QUEUE_GENERATION,
    resources: dict[str, Any] | None = None,
    rates: WorkerRates | None = None,
) -> int:
    """The demo; ``resources`` (default: from the environment) and the workers' ``rates`` let a test shorten time."""
    resources = resources or resources_from_env()
    queue_db, cache_db, policy_resource = resources["queue_db"], resources["cache_db"], resources["zombie_policy"]
    real_database = queue_db.url() is not None or cache_db.url() is not None
    check_databases(queue_db, cache_db)  # a closed port or a refusal: one line, in seconds, before anything else
    store = store_of(queue_db, cache_db)
    policy = policy_resource.policy()
    print(f"queue: {queue_db.describe()}\ncache: {cache_db.describe()}")

    if real_database:
        print("A MongoDB URL is set: the demo simulates nothing and writes nothing (the cleanup runs as a dry run).")
    else:
        check_ours(store)  # the embedded server may hold a database loaded by hand: never written to
        if fresh or simulated_generation(store) not in (None, generation):
            drop_simulation(store)
        store.ensure_indexes()
        _fill(store, finished, seed, policy, generation)

    run_config = {
        "ops": {"reconcile": {"config": {"dry_run": real_database}}},
        "loggers": QUIET,
    }
    with _living_queue(
        store, generation, policy, seed, rates or WorkerRates(crash_rate=0.0), enabled=not real_database
    ):
        return _run_pipeline(store, resources, run_config, policy, real_database)


@contextlib.contextmanager
def _living_queue(store, generation: str, policy, seed: int, rates: WorkerRates, enabled: bool):
    """Simulated workers take waiting jobs, heartbeat and finish while the demo runs; stopped, they finish what they hold."""
    if not enabled:
        yield None
        return
    pool = WorkerPool(store, QUEUE_GENERATIONS[generation], policy, rates, seed=seed)
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
    print(
        f"\nkill_zombies_job: {'succeeded' if result.success else 'FAILED'} in {seconds:.1f} s (run {result.run_id[:8]})"
    )
    if not result.success:
        print("  " + _failure_line(result))
        if not real_database:
            print("  (start from a fresh simulated queue with: zombie-pipeline demo --fresh)")
        return 1
    if real_database:
        found = _output_metadata(result, "find_zombies").get("candidates")
        print(
            f"  dry run: {found.value if found else 0} zombies found and left alone (their evidence: the find_zombies step)"
        )
    summary = summarize(store, result.run_id, result.output_for_node("summarize"))
    print("  " + summary.one_line())
    for row in summary.rows[:8]:
        print(f"  - {row['type']:<32} {row['dataset']:<28} {row['reason']:<22} ran {row['ran_seconds']:>7.0f} s")
    if len(summary.rows) > 8:
        print(f"  ... and {len(summary.rows) - 8} more (see the run's metadata in the Dagster UI)")
    print(f"  zombies left: {count_stale(store.jobs, policy, utc_now())}")
    print(f"  audit trail: {store.events.count_documents({})} events in {store.events.full_name}")

    try:
        files, window_end = _materialize_statistics(resources, _instance, save_suggestions=not real_database)
    except _NotComputed as error:
        print(f"\nduration_statistics: not computed: {error}")
        return 0
    print(f"\nduration_statistics for the {DEFAULT_WINDOW_DAYS} days to {window_end:%Y-%m-%d %H:%M} UTC:")
    report = analyze_window(
        store, decide(store, policy).required_queue(), policy, end=window_end
    )  # the asset's figures, for the terminal
    print(summary_text(report, files))
    return 0


def _output_metadata(result: dg.ExecuteInProcessResult, step: str) -> dict:
    for event in result.events_for_node(step):
        if event.is_successful_output:
            return dict(event.step_output_data.metadata)
    return {}


class _NotComputed(Exception):
    """A statistics run failed; the message is its one line."""


def _failure_line(result: dg.ExecuteInProcessResult) -> str:
    """Why the run failed, in the one line its failure carries (a Failure's description, else the error's last line)."""
    for event in result.all_events:
        if event.is_step_failure:
            data = event.step_failure_data
            if data.user_failure_data is not None and data.user_failure_data.description:
                return data.user_failure_data.description
            if data.error is not None:
                return data.error.message.strip().splitlines()[-1]
    return "the run failed before its first step (see the Dagster run's events)"


def _materialize_statistics(resources, instance_factory, save_suggestions: bool) -> tuple[ReportFiles, dt.datetime]:
    """The statistics assets through Dagster: each day of the window, then the window's report.

    Daily partitions are whole UTC days, so the window ends at midnight, with yesterday.
    """
    run_config: dict = {"loggers": QUIET}  # the window's unused days (its mapping spans 28) would each log a warning
    statistics_config = {
        **run_config,
        "ops": {job_duration_statistics.op.name: {"config": {"save_suggestions": save_suggestions}}},
    }
    window_end = dt.datetime.combine(utc_now().date(), dt.time(), tzinfo=dt.UTC)
    days = [(window_end - dt.timedelta(days=n)).date().isoformat() for n in range(DEFAULT_WINDOW_DAYS, 0, -1)]
    with instance_factory() as instance:
        for day in days:
            daily = dg.materialize(
                [job_duration_tallies],
                partition_key=day,
                resources=resources,
                instance=instance,
                run_config=run_config,
                raise_on_error=False,
            )
            if not daily.success:
                raise _NotComputed(_failure_line(daily))
        result = dg.materialize(
            [job_duration_tallies, job_duration_statistics],
            selection=[job_duration_statistics],
            partition_key=days[-1],
            resources=resources,
            instance=instance,
            run_config=statistics_config,
            raise_on_error=False,
        )
    if not result.success:
        raise _NotComputed(_failure_line(result))
    [materialization] = result.asset_materializations_for_node(job_duration_statistics.op.name)
    paths = {name: Path(materialization.metadata[name].value) for name in ("csv", "json", "chart", "markdown")}
    return ReportFiles(**paths), window_end


def _fill(store, finished: int, seed: int, policy, generation: str) -> None:
    """Simulate a deployment into an empty queue; top up with new zombies once they are all cleaned."""
    if simulated_generation(store) is None:
        workload = Workload(finished=finished, seed=seed, generation=generation, policy=policy)
        print(
            f"empty queue: simulating a {generation} deployment, {workload.total} jobs over {workload.days:.0f} days ..."
        )
    elif count_stale(store.jobs, policy, utc_now()) == 0:
        workload = Workload(finished=0, waiting=20, running=40, seed=seed, generation=generation, policy=policy)
        print("no zombies left from earlier demos: simulating workers that crashed since ...")
    else:
        return
    simulate(store, workload)
