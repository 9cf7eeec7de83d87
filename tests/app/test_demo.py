"""The demo on the embedded default: a first run that shows every part, a second that still works, a living queue.

The demo prints what its runs recorded (the cleanup's report_cleanup step, the statistics' report file, the repeat
offenders' table): the figures printed are checked against those files and tables here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import documents, run_kill_zombies, step_failure_messages
from tests.servers import REPO_ROOT, kill_recorded_server
from zombie_pipeline.app import cli
from zombie_pipeline.app.demo import _living_queue, run_demo
from zombie_pipeline.config import (
    CACHE_URL_ENV,
    DAGSTER_HOME_ENV,
    HOME_ENV,
    QUEUE_URL_ENV,
)
from zombie_pipeline.defs.resources import (
    ZombiePolicyResource,
    resources_from_env,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState
from zombie_pipeline.queue.generations import NEWEST_QUEUE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.simulation.history import OFFENDER
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workers import QueueClaim, WorkerPool, WorkerRates
from zombie_pipeline.simulation.workload import Workload

#: The heartbeat timeout of the test's policy: the workers beat every second, and a loaded host (two cores, four
#: CPU-bound processes beside, this process running the cleanup too) delayed their beats by up to 1.8 s, up to 5.4 s
#: before the beats were written between the jobs a tick finishes and starts (tests/simulation/test_workers.py): 12 s
#: leaves six times the worst delay measured, and the test still waits out a whole timeout.
TIMEOUT = 12
#: Jobs of seconds to minutes, beating every second, never crashing: the test decides who dies.
RATES = WorkerRates(heartbeat_seconds=1, crashes_per_worker_hour=0, overruns_per_worker_hour=0)


@pytest.fixture
def embedded_home(tmp_path, monkeypatch):
    """No URL: every command, run and worker uses the embedded server of a project home of the test's own."""
    home = tmp_path / "home"
    for variable in (QUEUE_URL_ENV, CACHE_URL_ENV, DAGSTER_HOME_ENV):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(HOME_ENV, str(home))
    try:
        yield home
    finally:
        kill_recorded_server(home)


@pytest.mark.slow  # the whole demo, tens of seconds
def test_a_first_demo_shows_the_cleanup_the_statistics_and_a_repeat_offender_from_what_its_runs_recorded(
    embedded_home, capsys
):
    assert run_demo() == 0
    printed = capsys.readouterr().out

    assert "kill_zombies_job: succeeded" in printed
    assert "finalized 33 zombies (20 missing heartbeat, 5 never heartbeated, 3 terminated, 5 exceeded" in printed
    assert "today 33 zombies beside 99 healthy started jobs" in printed
    # the statistics, as the report file of the run says them
    [report_path] = re.findall(r"report: \S+\.md, \S+\.csv, (\S+\.json),", printed)
    report = json.loads(Path(report_path).read_text())
    for entry in report["types"]:
        line = next(line for line in printed.splitlines() if line.strip().startswith(entry["type"] + " "))
        assert f"{entry['success_count']} successes" in line
        if entry["enough_data"]:
            assert (
                f"T2 {entry['current_t2_seconds']} s -> {entry['suggested_t2_seconds']} s ({entry['change']})" in line
            )
    changes = {entry["change"] for entry in report["types"]}
    assert {"lower", "raise"} <= changes  # history enough for a T2 to be lowered with confidence, and another raised
    assert report["events_read"] > 0  # the past days' cleanups are in the window
    # the repeat offender of the week, from the materialization's table
    assert "repeat offenders (" in printed and "1 dataset finalized at least 3 times" in printed
    assert f"- {OFFENDER[1]} {OFFENDER[0]}: 7 times" in printed
    # the quarantine its history began (the offender's third crash in 72 hours), and how to lift it
    assert "quarantined now (1: their crashes are not re-enqueued until lifted or lapsed):" in printed
    assert f"  - {OFFENDER[1]} {OFFENDER[0]}: 3 crashes within 72 h, since " in printed
    assert f"lift_quarantine_job (Launchpad config: ops: lift_quarantine: config: dataset: {OFFENDER[1]}, " in printed
    # a retry scheduled after a delay says why: the timeouts' re-runs wait for the deployment's executor
    scheduled = int(re.findall(r"(\d+) scheduled after a delay", printed)[0])
    if scheduled:
        assert re.search(
            r"scheduled after a delay \(\d+ timeouts?: (its|their) re-run waits until the deployment's", printed
        )
    assert "simulated workers, while the statistics and the watcher ran: " in printed and " crashed" not in printed
    # the watcher: three workers that stop beating now, each released when its deadline comes, not a poll later
    assert "3 workers stopped beating, one every 4 s" in printed and "zombie_watch_job: succeeded" in printed
    assert "released 3 zombies at their deadline:" in printed
    lags = [float(lag) for lag in re.findall(r"missing_heartbeat\s+(\d+\.\d+) s after the rule allowed it", printed)]
    assert len(lags) == 3 and max(lags) < 5, lags  # 2 s between refreshes of the deadlines, on a loaded host too
    # the runs outlive the demo, where the command it prints opens the UI: Dagster's own CLI lists them from there
    [kept, command] = re.findall(r"These runs are kept in (\S+); the Dagster UI shows them: (.+)", printed)[0]
    assert Path(kept) == embedded_home / "dagster"
    variable, dagster, dev, *workspace = shlex.split(command)
    assert (
        variable == f"{DAGSTER_HOME_ENV}={kept}"
        and dev == "dev"
        and workspace == ["-w", str(REPO_ROOT / "workspace.yaml")]
    )
    listed = subprocess.run(
        [dagster, "run", "list"],
        env={**os.environ, DAGSTER_HOME_ENV: kept},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    for run in re.findall(r"\(run ([0-9a-f]{8})\)", printed):  # the cleanup's, the statistics'
        assert f"Run: {run}" in listed.stdout, (run, listed.stdout[:2_000])


def test_the_demo_refuses_a_size_for_a_simulation_it_would_not_make(embedded_home, capsys):
    def store():  # the command closes the process's clients when it ends
        return resources_from_env()["databases"].store()

    simulate(store(), Workload(finished=10, running=20, waiting=0))
    before = store().jobs.count_documents({})

    assert cli.main(["demo", "--finished", "50"]) == 2

    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("zombie-pipeline: --finished sizes a new simulation") and "add --fresh" in error
    assert store().jobs.count_documents({}) == before


@pytest.mark.slow  # the whole demo, tens of seconds
def test_the_demo_and_a_cleanup_from_the_ui_succeed_after_the_workers_ran_past_the_heartbeat_timeout(
    embedded_home, capsys
):
    """Time is shortened, not faked: a heartbeat timeout of 12 s and workers beating every second, so the workers
    run past the timeout in seconds. Without their heartbeats every healthy job would look dead by then, and the
    brake would stop the cleanup."""
    resources: dict[str, Any] = {
        **resources_from_env(),
        "zombie_policy": ZombiePolicyResource(heartbeat_timeout_seconds=TIMEOUT),
    }
    policy = resources["zombie_policy"].policy()
    store = resources["databases"].store()  # starts the embedded server
    # zombie-pipeline simulate: 40 healthy jobs and 5 zombies
    simulation = simulate(
        store,
        Workload(
            finished=100, crashed=2, never_heartbeated=1, terminated=1, overdue=1, running=40, waiting=10, policy=policy
        ),
    )
    # zombie-pipeline workers, beside the UI
    pool = WorkerPool(store, QUEUE_GENERATIONS[NEWEST_QUEUE_GENERATION], policy, RATES, seed=1)
    assert pool.adopt_running() == 40
    stopping = threading.Event()
    workers = threading.Thread(target=pool.run, args=(600, stopping.is_set, 0.25), daemon=True)
    workers.start()
    try:
        time.sleep(TIMEOUT + 1.5)
        started = store.jobs.count_documents({Job.STATUS: Status.STARTED})
        assert started >= 40  # each healthy job kept its worker: the pool never shrinks below the jobs it adopted

        launched = run_kill_zombies(resources)  # as the UI launches it: no run config
    finally:
        stopping.set()
        workers.join(timeout=60)

    assert launched.success, step_failure_messages(launched)
    finalized = {event[ID] for event in store.events.find({}, {ID: 1})}
    assert finalized == set(simulation.zombie_ids)  # the simulated zombies, and not one of the jobs kept alive
    assert store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 0  # stopped workers finish what they hold

    assert run_demo(rates=RATES) == 0  # the demo, again on that queue, with the default policy
    printed = capsys.readouterr().out
    assert "no zombies left from earlier demos" in printed and "kill_zombies_job: succeeded" in printed
    assert store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 0
    assert store.events.count_documents({Event.STATE: {"$ne": EventState.DONE}}) == 0


def test_the_demos_workers_stay_off_beside_a_workers_process_already_on_the_queue(store, capsys):
    simulate(
        store, Workload(finished=0, crashed=1, never_heartbeated=0, terminated=0, overdue=0, running=20, waiting=5)
    )
    QueueClaim.of(store).take()  # zombie-pipeline workers, running
    before = documents(store)

    with _living_queue(store, NEWEST_QUEUE_GENERATION, ZombiePolicy(), 0, RATES, enabled=True) as pool:
        assert pool is None

    printed = capsys.readouterr().out
    assert "simulated workers already run on this queue" in printed and "the demo's own workers stay off" in printed
    assert documents(store) == before  # no second process adopting, beating and finishing the same jobs
