"""``zombie-pipeline demo``: the whole pipeline on the embedded default, in one command.

On the embedded server it simulates a deployment (a week of history cleaned daily, with a dataset that crashes
its worker every day, and today's zombies beside healthy started jobs), runs ``kill_zombies_job``, then the
statistics and ``repeat_offenders`` of the week ending yesterday, through Dagster, and prints what those runs
recorded: the cleanup's summary from its ``report_cleanup`` step, the statistics from the report files their
materialization names, the offenders from their materialization's table; last, workers that stop beating as it runs,
each released by a short ``zombie_watch_job`` at its deadline. The runs are kept in a Dagster instance
that outlives the demo (``config.dagster_home``), and the demo prints the command that opens the UI on it.

The cleanup sees the queue the simulator meant, on any machine: the simulated workers only start once it is
done, and the healthy started jobs are sized so that the dead are at most half the brake's threshold
(``simulator.healthy_beside``). A queue simulated earlier whose healthy jobs went stale since (nobody
heartbeated them) gets new healthy ones rather than a brake stop.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shlex
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import pymongo

from zombie_pipeline import config
from zombie_pipeline.app.errors import OptionRefused, Progress, cut_short, progress_of
from zombie_pipeline.cleanup.detection import count_stale, started_filter
from zombie_pipeline.cleanup.quarantine import quarantine_row
from zombie_pipeline.cleanup.run import RunSummary
from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.failures.causes import result_cause
from zombie_pipeline.defs.resources import DeploymentResources, resources_from_env
from zombie_pipeline.defs.statistics.assets import job_duration_statistics, job_duration_tallies
from zombie_pipeline.defs.statistics.heartbeat_gaps import heartbeat_gap_tallies
from zombie_pipeline.defs.statistics.repeat_offenders import repeat_offenders
from zombie_pipeline.defs.watch.jobs import zombie_watch_job
from zombie_pipeline.messages import counted, plural
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.generations import NEWEST_QUEUE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.marks import simulated_generation
from zombie_pipeline.simulation.ownership import check_ours, drop_simulation
from zombie_pipeline.simulation.simulator import Simulation, simulate
from zombie_pipeline.simulation.workers import QueueClaim, WorkerPool, WorkerRates, WorkersRunning
from zombie_pipeline.simulation.workload import Workload, healthy_beside
from zombie_pipeline.statistics.analysis import DEFAULT_WINDOW_DAYS
from zombie_pipeline.trail import active_quarantines

#: Dagster's console logger silenced: the demo prints its own summary, and a failure as its one line, never a stack trace.
QUIET = {"console": {"config": {"log_level": "CRITICAL"}}}
#: How to give a database up to the demo (its ``{name}``), in options that exist.
GIVE_UP = (
    "Give the demo databases of its own (QUEUE_MONGO_DATABASE and CACHE_MONGO_DATABASE), or, if it is a scratch "
    "database you own, give it up with: zombie-pipeline simulate --drop --overwrite-database {name}"
)
#: The days before today the simulated deployment was cleaned daily: the statistics' window.
PAST_DAYS = DEFAULT_WINDOW_DAYS
DEFAULT_FINISHED = 8_000  # some types get the 368 successful runs in the window that lowering a T2 needs
#: The watcher's turn: this many workers stop beating, one every few seconds, and a short watch run releases each.
WATCHED_DEATHS = 3
DEATH_SPACING_SECONDS = 4
WATCH_MARGIN_SECONDS = 6  # the watch run goes on this long after the last deadline


def _instance() -> dg.DagsterInstance:
    """The Dagster instance of :func:`config.dagster_home`: the runs outlive the demo, for ``dagster dev`` to show."""
    path = config.dagster_home()
    path.mkdir(parents=True, exist_ok=True)
    settings = path / "dagster.yaml"
    if not config.setting(config.DAGSTER_HOME_ENV) and not settings.exists():  # ours: say so, not Dagster's warning
        settings.write_text("# The demo's Dagster instance (zombie-pipeline demo): Dagster's defaults, kept here.\n")
    return dg.DagsterInstance.from_config(str(path))


def ui_command() -> str:
    """The command that opens the Dagster UI on the demo's runs: ``dagster dev`` with the demo's ``DAGSTER_HOME``."""
    beside = Path(sys.executable).parent / "dagster"
    dagster = shlex.quote(str(beside)) if beside.exists() else "dagster"
    workspace = config.SOURCE_CHECKOUT / "workspace.yaml" if config.SOURCE_CHECKOUT else None
    where = (
        f"-w {shlex.quote(str(workspace))}" if workspace and workspace.exists() else "-m zombie_pipeline.definitions"
    )
    return f"{config.DAGSTER_HOME_ENV}={shlex.quote(str(config.dagster_home()))} {dagster} dev {where}"


def run_demo(
    finished: int = DEFAULT_FINISHED,
    seed: int = 0,
    fresh: bool = False,
    generation: str = NEWEST_QUEUE_GENERATION,
    resources: DeploymentResources | None = None,
    rates: WorkerRates | None = None,
    refuse_finished: bool = False,
) -> int:
    """The demo; ``resources`` (default: from the environment) and the workers' ``rates`` let a test shorten time.

    ``refuse_finished``: ``finished`` was asked for, so a queue kept as it is (not simulated anew) is refused.
    """
    resources = resources or resources_from_env()
    databases, policy_resource = resources["databases"], resources["zombie_policy"]
    real_database = any(url is not None for url in databases.urls())
    databases.check_reachable()  # a closed port or a refusal: one line, in seconds, before anything else
    store = databases.store()
    policy = policy_resource.policy()
    print("\n".join(f"{role}: {where}" for role, where in databases.describe().items()))
    progress = progress_of("demo", resources)

    with progress.watching():
        if real_database:
            print(
                "A MongoDB URL is set: the demo simulates nothing and writes nothing (the cleanup runs as a dry run)."
            )
        else:
            progress("reading what the databases hold")
            check_ours(store, give_up=GIVE_UP)  # the embedded server may hold a database loaded by hand: never written
            present = simulated_generation(store)
            if refuse_finished and present is not None and not fresh and present == generation:
                raise OptionRefused(
                    "--finished sizes a new simulation, and these databases already hold one, kept as it is: add "
                    "--fresh to simulate again"
                )
            progress.then = cut_short("zombie-pipeline demo --fresh")
            if fresh or present not in (None, generation):  # only once the server took a write, the marker last
                drop_simulation(store, progress=progress)
            progress("creating the indexes")
            store.ensure_indexes()
            _prepare_queue(store, finished, seed, policy, generation, progress)

        run_config = {"ops": {"plan_and_recover": {"config": {"dry_run": real_database}}}, "loggers": QUIET}
        with _instance() as instance:
            succeeded = _cleanup(resources, run_config, instance, real_database)
            progress("reading the quarantines")
            print(quarantines_text(active_quarantines(store, utc_now())))
            if succeeded:
                progress("starting the simulated workers")
                with _living_queue(store, generation, policy, seed, rates or WorkerRates(), enabled=not real_database):
                    _statistics(resources, instance, save_suggestions=not real_database)
                    if not real_database:  # beside the living workers, as a watch meets a fleet
                        _watch(resources, instance, store, policy, generation, seed, progress)
    print(f"\nThese runs are kept in {config.dagster_home()}; the Dagster UI shows them: {ui_command()}")
    return 0 if succeeded else 1


def _prepare_queue(
    store: Store, finished: int, seed: int, policy: ZombiePolicy, generation: str, progress: Progress
) -> None:
    """A simulated queue as the cleanup should meet it: zombies, beside enough healthy started jobs."""
    if simulated_generation(store) is None:
        zombies = Workload(finished=0, generation=generation)
        workload = Workload(
            finished=finished,
            running=healthy_beside(zombies.zombies, policy),
            days=PAST_DAYS + 1,
            past_cleanups=PAST_DAYS,
            seed=seed,
            generation=generation,
            policy=policy,
        )
        print(
            f"empty queue: simulating a {generation} deployment: {workload.finished} finished jobs over "
            f"{workload.days:.0f} days, cleaned daily; today {workload.zombies} zombies beside {workload.running} "
            "healthy started jobs ..."
        )
        simulate(store, workload, progress=progress)
        return
    progress("counting the zombies left from earlier demos")
    now = utc_now()
    dead = count_stale(store.jobs, policy, now)
    if dead == 0:
        zombies = Workload(finished=0, waiting=20, seed=seed, generation=generation, policy=policy)
        print(f"no zombies left from earlier demos: simulating {zombies.zombies} workers that crashed since ...")
        simulate(
            store,
            Workload(**{**zombies.__dict__, "running": healthy_beside(zombies.zombies, policy)}),
            progress=progress,
        )
        return
    healthy = store.jobs.count_documents(started_filter()) - dead
    missing = healthy_beside(dead, policy) - healthy
    if missing > 0:  # their workers stopped long ago: a deployment has healthy jobs beside its dead ones
        print(
            f"{counted(dead, 'zombie')} beside {counted(healthy, 'healthy started job')} (the simulated workers stopped since): adding "
            f"{missing} healthy started jobs ..."
        )
        _add_started_jobs(store, missing, seed, generation, policy, progress)


def _add_started_jobs(
    store: Store, count: int, seed: int, generation: str, policy: ZombiePolicy, progress: Progress
) -> Simulation:
    """``count`` started jobs, heartbeating as of now, and nothing else."""
    workload = Workload(
        finished=0,
        crashed=0,
        never_heartbeated=0,
        terminated=0,
        overdue=0,
        running=count,
        waiting=0,
        seed=seed,
        generation=generation,
        policy=policy,
    )
    return simulate(store, workload, progress=progress)


def _cleanup(
    resources: DeploymentResources, run_config: dict[str, Any], instance: dg.DagsterInstance, real_database: bool
) -> bool:
    """``kill_zombies_job``, then what its steps recorded; False when it failed (its cause printed)."""
    started = time.monotonic()
    result = kill_zombies_job.execute_in_process(
        run_config=run_config, resources=resources, instance=instance, raise_on_error=False
    )
    seconds = time.monotonic() - started
    print(
        f"\nkill_zombies_job: {'succeeded' if result.success else 'FAILED'} in {seconds:.1f} s (run {result.run_id[:8]})"
    )
    if not result.success:
        print("  " + result_cause(result))
        return False
    if real_database:
        found = step_metadata(result, "find_zombies").get("candidates")
        print(
            f"  dry run: {counted(found.value if found else 0, 'zombie')} found and left alone (their evidence: the find_zombies step)"
        )
        return True
    summary = RunSummary(
        Counter(result.output_for_node("report_cleanup")), table_rows(result, "report_cleanup", "finalized_jobs")
    )
    print("  " + summary.one_line())
    for row in summary.rows[:8]:
        print(f"  - {row['type']:<32} {row['dataset']:<28} {row['reason']:<22} ran {row['ran_seconds']:>7.0f} s")
    if len(summary.rows) > 8:
        print(f"  ... and {len(summary.rows) - 8} more (in the run's metadata: the Dagster UI, below)")
    return True


def _watch(
    resources: DeploymentResources,
    instance: dg.DagsterInstance,
    store: Store,
    policy: ZombiePolicy,
    generation: str,
    seed: int,
    progress: Progress,
) -> None:
    """``zombie_watch_job`` at work, as ``zombie_watch_sensor`` keeps it running wherever a daemon runs: workers whose
    last heartbeat puts their deadline (that beat + the heartbeat timeout) a few seconds ahead, each released when
    its deadline comes, with the lag the watcher added to the rule."""
    progress("simulating workers that die now")
    simulation = _add_started_jobs(store, WATCHED_DEATHS, seed, generation, policy, progress)
    now = utc_now()
    deadlines = [now + dt.timedelta(seconds=n * DEATH_SPACING_SECONDS) for n in range(1, WATCHED_DEATHS + 1)]
    timeout = dt.timedelta(seconds=policy.heartbeat_timeout_seconds)
    for job_id, deadline in zip(simulation.running_ids, deadlines, strict=True):
        beat = deadline - timeout  # its only beat, as it started
        store.jobs.update_one({ID: job_id}, {"$set": {Job.STARTED_AT: beat, Job.LAST_HEARTBEAT: beat}})
    watch_seconds = (deadlines[-1] - now).total_seconds() + WATCH_MARGIN_SECONDS
    print(
        f"\n{counted(WATCHED_DEATHS, 'worker')} stopped beating, one every {DEATH_SPACING_SECONDS} s: their deadlines "
        f"(last heartbeat + {timeout.total_seconds():.0f} s) come in {(deadlines[0] - now).total_seconds():.0f}-"
        f"{(deadlines[-1] - now).total_seconds():.0f} s"
    )
    progress("watching the deadlines")
    result = zombie_watch_job.execute_in_process(
        run_config={"ops": {"watch_deadlines": {"config": {"run_minutes": watch_seconds / 60}}}, "loggers": QUIET},
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    print(
        f"zombie_watch_job: {'succeeded' if result.success else 'FAILED'} (run {result.run_id[:8]}, {watch_seconds:.0f} s)"
    )
    if not result.success:
        print("  " + result_cause(result))
        return
    rows = table_rows(result, "watch_deadlines", "finalized_jobs")
    print(f"  released {counted(len(rows), 'zombie')} at {plural(len(rows), 'its', 'their')} deadline:")
    for row in rows:
        print(
            f"  - {row['type']:<32} {row['dataset']:<28} {row['reason']:<22} {row['release_lag_seconds']:.2f} s after "
            "the rule allowed it"
        )
    if len(rows) < WATCHED_DEATHS:  # a watch of dagster dev's holding the lease, or the brake: the run says which
        metadata = step_metadata(result, "watch_deadlines")
        print(
            f"  the watch ended: {metadata['ended_because'].value}; {metadata['brake_refusals'].value} brake refusals"
        )
    print(
        "  kept running by zombie_watch_sensor wherever a daemon runs (dagster dev included); watch_deadlines: false turns it off"
    )


def quarantines_text(quarantines: Sequence[Mapping[str, Any]]) -> str:
    """The quarantines holding now, and how an operator lifts one."""
    if not quarantines:
        return "  quarantined now: none"
    lines = [f"  quarantined now ({len(quarantines)}: their crashes are not re-enqueued until lifted or lapsed):"]
    for quarantine in quarantines:
        row = quarantine_row(quarantine)
        lines.append(
            f"  - {row['dataset']} {row['type']}: {row['crashes']} crashes within {row['window_hours']} h, since "
            f"{row['since']} UTC, lapses {row['lapses_at']} UTC"
        )
    first = quarantine_row(quarantines[0])
    lines.append(
        "  lift one with lift_quarantine_job (Launchpad config: ops: lift_quarantine: config: dataset: "
        f"{first['dataset']}, job_type: {first['type']}): its withheld jobs run again"
    )
    return "\n".join(lines)


def step_metadata(result: dg.ExecuteInProcessResult, step: str) -> dict[str, Any]:
    """The metadata a step recorded on its output."""
    for event in result.events_for_node(step):
        if event.is_successful_output:
            return dict(event.step_output_data.metadata)
    return {}


def table_rows(result: dg.ExecuteInProcessResult, step: str, name: str) -> list[dict[str, Any]]:
    table = step_metadata(result, step).get(name)
    return [dict(record.data) for record in table.records] if table is not None else []


@contextlib.contextmanager
def _living_queue(
    store: Store, generation: str, policy: ZombiePolicy, seed: int, rates: WorkerRates, enabled: bool
) -> Iterator[WorkerPool | None]:
    """Simulated workers take the healthy started jobs over and move the queue while the statistics run; stopped,
    they finish what they hold. Not beside a ``zombie-pipeline workers`` already on the queue: one process of workers
    per queue (:class:`QueueClaim`)."""
    if not enabled:
        yield None
        return
    claim = QueueClaim.of(store)
    try:
        claim.take()
    except WorkersRunning as running:
        print(f"\n{running}: the demo's own workers stay off")
        yield None
        return
    pool = WorkerPool(store, QUEUE_GENERATIONS[generation], policy, rates, seed=seed, claim=claim)
    try:
        pool.adopt_running()
    except BaseException:
        with contextlib.suppress(pymongo.errors.PyMongoError):
            claim.release()
        raise
    stopping = threading.Event()
    thread = threading.Thread(target=pool.run, args=(3_600, stopping.is_set), daemon=True, name="simulated-workers")
    thread.start()
    try:
        yield pool
    finally:
        stopping.set()
        thread.join(timeout=60)
        print(f"\nsimulated workers, while the statistics and the watcher ran: {pool.summary()}")


def _statistics(resources: DeploymentResources, instance: dg.DagsterInstance, save_suggestions: bool) -> None:
    """The week ending yesterday through Dagster: each day's tallies, then the week's statistics and repeat
    offenders; printed from what their materializations recorded. Daily partitions are whole UTC days."""
    quiet: dict[str, Any] = {"loggers": QUIET}  # the demo prints what the runs recorded, not their logs
    window_end = dt.datetime.combine(utc_now().date(), dt.time(), tzinfo=dt.UTC)
    days = [(window_end - dt.timedelta(days=n)).date().isoformat() for n in range(DEFAULT_WINDOW_DAYS, 0, -1)]
    for day in days:
        daily = dg.materialize(
            [job_duration_tallies],
            partition_key=day,
            resources=resources,
            instance=instance,
            run_config=quiet,
            raise_on_error=False,
        )
        if not daily.success:
            print(f"\nduration_statistics: not computed: {result_cause(daily)}")
            return
    statistics_config = {
        **quiet,
        "ops": {job_duration_statistics.op.name: {"config": {"save_suggestions": save_suggestions}}},
    }
    result = dg.materialize(
        [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics, repeat_offenders],
        selection=[job_duration_statistics, repeat_offenders],
        partition_key=days[-1],
        resources=resources,
        instance=instance,
        run_config=statistics_config,
        raise_on_error=False,
    )
    if not result.success:
        print(f"\nduration_statistics: not computed: {result_cause(result)}")
        return
    print(f"\nduration_statistics and repeat_offenders of the {DEFAULT_WINDOW_DAYS} days to {window_end:%Y-%m-%d} "
          f"00:00 UTC (run {result.run_id[:8]}):")  # fmt: skip
    [statistics] = result.asset_materializations_for_node(job_duration_statistics.op.name)
    print(statistics_text(statistics.metadata))
    [offenders] = result.asset_materializations_for_node(repeat_offenders.op.name)
    print(offenders_text(offenders.metadata))


def statistics_text(metadata: Mapping[str, Any]) -> str:
    """The statistics as their report file (JSON) says: a line per type, the files, the policy snippet."""
    report = json.loads(Path(metadata["json"].value).read_text())
    lines = [
        f"  {counted(report['jobs_read'], 'run')} read ({report['source']}), {counted(report['events_read'], 'zombie')} "
        "finalized in the "
        f"window; {metadata['types_to_change'].value} of {len(report['types'])} job types change their T2:"
    ]
    for entry in report["types"]:
        successes = entry.get("success_count") or 0
        line = f"  {entry['type']:<32} {successes:>5} {plural(successes, 'success')}, "
        if entry["enough_data"]:
            line += f"T2 {entry['current_t2_seconds']} s -> {entry['suggested_t2_seconds']} s ({entry['change']})"
        else:
            line += "not enough data: T2 kept"
        if entry["lowering_withheld"]:
            line += ", lowering withheld (too few runs to be sure)"
        lines.append(line)
    files = ", ".join(str(metadata[name].value) for name in ("markdown", "csv", "json", "chart"))
    lines.append(f"  report: {files}")
    lines.append("  suggested configuration:")
    lines.extend("    " + line for line in report["zombie_policy_snippet"].splitlines())
    return "\n".join(lines)


def offenders_text(metadata: Mapping[str, Any]) -> str:
    """The repeat offenders as their materialization's table lists them."""
    threshold = metadata["threshold"].value
    table = metadata.get("offenders_table")
    rows = [dict(record.data) for record in table.records] if table is not None else []
    offenders = metadata["offenders"].value
    lines = [
        f"  repeat offenders ({metadata['window'].value}): {offenders} dataset{'' if offenders == 1 else 's'} "
        f"finalized at least {counted(threshold, 'time')}, of {metadata['datasets_finalized'].value} finalized "
        f"({counted(metadata['finalizations'].value, 'finalization')})"
    ]
    for row in rows[:5]:
        limit = ", retry limit reached" if row["retry_limit_reached"] else ""
        lines.append(
            f"  - {row['dataset']} {row['type']}: {counted(row['finalizations'], 'time')}, last {row['last_seen']}, last error "
            f"{row['last_error']}{limit}"
        )
    return "\n".join(lines)
