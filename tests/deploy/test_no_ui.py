"""docs/deploy.md without the UI, run as written: the wait for the code server, then section 4 in commands.

The lines are read from the docs' code blocks and run by bash, the install path replaced by this environment's and
the code server's port by the test's. The code server is the Dockerfile's command on a free port, found through
deploy/workspace.yaml; the instance is SQLite in a temporary ``DAGSTER_HOME`` (the commands do not depend on its
storage: tests/deploy/test_production.py runs the same operations on PostgreSQL, through Dagster's API). The dry
run is launched on a simulated queue of the session's server, and must write nothing; the daemon, started once the
code server answers as the docs start it, takes it from the run queue.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import InstigatorStatus

from tests.deploy import processes
from tests.deploy.processes import REPO_ROOT
from tests.e2e.harness import wait_for
from tests.helpers import documents, found
from zombie_pipeline.config import CACHE_DATABASE_ENV, CACHE_URL_ENV, HOME_ENV, QUEUE_DATABASE_ENV, QUEUE_URL_ENV
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workload import Workload

pytestmark = pytest.mark.slow  # a whole production stack: run apart by .ci/run

DOCS = (REPO_ROOT / "docs" / "deploy.md").read_text()
INSTALLED = "/opt/zombie-pipeline/bin/"
#: What section 4 turns on, in its order; the three sensors that run by default are left as they are.
TURNED_ON = ["kill_zombies_schedule", "stale_jobs_sensor", "cleanup_overdue_sensor", "duration_stats_schedule"]


def code_block(after: str) -> str:
    """The first ```bash block of docs/deploy.md after the heading ``after``."""
    section = DOCS[DOCS.index(after) :]
    return found(re.search(r"```bash\n(.*?)```", section, re.DOTALL)).group(1)


def as_here(lines: str, port: int) -> str:
    """The docs' lines with this environment's programs and the test's port."""
    return lines.replace(INSTALLED, str(Path(processes.executable("dagster")).parent) + "/").replace(
        "-p 4000", f"-p {port}"
    )


def test_the_no_ui_path_waits_for_the_code_server_then_turns_section_4_on_with_a_dry_run_first(
    store: Store, mongo_url, tmp_path
):
    # healthy jobs only: the sensor turned on asks for no cleanup, so whatever the daemon launches writes nothing
    simulate(
        store,
        Workload(finished=50, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=20, past_cleanups=0),
    )
    before = documents(store)
    home, reports = tmp_path / "dagster_home", tmp_path / "zombie_pipeline_home"
    home.mkdir()
    reports.mkdir()
    shutil.copy(REPO_ROOT / "deploy" / "workspace.yaml", home / "workspace.yaml")
    port = free_port()
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith(("DAGSTER_", "ZOMBIE_"))},
        "DAGSTER_HOME": str(home),
        HOME_ENV: str(reports),
        "ZOMBIE_CODE_SERVER_HOST": "127.0.0.1",
        "ZOMBIE_CODE_SERVER_PORT": str(port),
        QUEUE_URL_ENV: mongo_url,
        CACHE_URL_ENV: mongo_url,
        QUEUE_DATABASE_ENV: store.jobs.database.name,
        CACHE_DATABASE_ENV: store.cache.database.name,
    }
    waiting = [line for line in code_block("### With plain processes").splitlines() if line.startswith("until ")]
    turning_on = code_block("### Turning it on without the UI")
    assert len(waiting) == 1 and all(name in turning_on for name in TURNED_ON)
    server = processes.code_server(port, env, tmp_path / "code_server.log").start()
    daemon = processes.daemon(home / "workspace.yaml", env, tmp_path / "daemon.log")
    try:
        waited = subprocess.run(
            ["bash", "-euc", as_here(waiting[0], port)], env=env, capture_output=True, text=True, timeout=300
        )
        assert waited.returncode == 0, waited.stderr
        server.check_running()
        daemon.start()  # as the docs start it, once the code server answers: it launches the queued dry run
        done = subprocess.run(
            ["bash", "-euc", as_here(turning_on, port)], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout + done.stderr + server.log_tail()
        with dg.DagsterInstance.from_config(str(home)) as instance:
            [dry_run] = [record.dagster_run for record in instance.get_run_records() if dry(record.dagster_run)]
            wait_for(
                "the dry run to end", lambda: found(instance.get_run_by_id(dry_run.run_id)).is_finished, timeout=300
            )
            finished = found(instance.get_run_by_id(dry_run.run_id))
            running = {
                state.name for state in instance.all_instigator_state() if state.status == InstigatorStatus.RUNNING
            }
    finally:
        daemon.stop()
        server.stop()

    assert finished.job_name == "kill_zombies_job" and finished.is_success, server.log_tail()
    assert set(TURNED_ON) <= running, (running, done.stdout)
    assert documents(store) == before  # a dry run: nothing written


def dry(run: dg.DagsterRun) -> bool:
    """Whether a run is the cleanup's dry run, as the docs launch it."""
    ops = run.run_config.get("ops")
    return (
        run.job_name == "kill_zombies_job"
        and isinstance(ops, dict)
        and ops.get("plan_and_recover", {}).get("config", {}).get("dry_run") is True
    )
