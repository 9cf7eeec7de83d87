"""One production deployment of deploy/ for a test module: PostgreSQL, the code server, the daemon.

Nothing in its place: a private PostgreSQL cluster holds the instance (deploy/dagster.yaml, copied into a fresh
DAGSTER_HOME, its variables pointing at that cluster; a test may change a setting of the copy, e.g. run
monitoring's poll interval, to wait seconds where production waits a minute); the code location is served by the
Dockerfile's command (``dagster code-server start``) and found through deploy/workspace.yaml; ``dagster-daemon
run`` fires schedules and sensors, keeps the run queue, monitors and retries the runs; runs are launched by the
code server, as in a deployment without Kubernetes (and as deploy/docker-compose.yaml runs it). The queue is
simulated on the session's MongoDB-wire server. Every process is stopped by PID when the block ends, and the
stack checks none is left.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from tests.deploy import processes
from tests.deploy.instance import Operator, operator
from tests.deploy.postgres import PrivateCluster, private_cluster
from tests.deploy.processes import REPO_ROOT
from tests.e2e.harness import wait_for
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    HOME_ENV,
    KILL_CRON_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
    WEBHOOK_URL_ENV,
)
from zombie_pipeline.queue.connections import client_for
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.jobs import ID, JobDocument
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.simulator import Simulation, simulate
from zombie_pipeline.simulation.workload import Workload

DEPLOY = REPO_ROOT / "deploy"
CLEANUP = "kill_zombies_job"
WATCH = "zombie_watch_job"
WATCH_SENSOR = "zombie_watch_sensor"
EVERY_MINUTE = "* * * * *"
RUN_TIMEOUT = 150  # a run takes seconds; the margin is for a machine busy with the rest of the suite


class Deployment:
    def __init__(self, store: Store, simulation: Simulation, zombies: list[JobDocument], cluster: PrivateCluster,
                 instance: dg.DagsterInstance, ops: Operator, env: dict[str, str], server_env: dict[str, str],
                 port: int, base: Path, server: processes.ProcessTree, daemon: processes.ProcessTree) -> None:  # fmt: skip
        self.store = store
        self.simulation = simulation
        self.zombies = zombies  # the zombie jobs as they were: finalized ones are deleted
        self.cluster = cluster
        self.instance = instance
        self.ops = ops
        self.env = env  # what the daemon (and any process opening the instance) runs with
        self.server_env = server_env  # and the code server, with the pipeline's own variables
        self.port = port
        self.base = base
        self.server = server
        self.daemon = daemon
        self.stopped: list[processes.ProcessTree] = []

    def wait(self, what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
        """``wait_for``, and on a timeout the daemon's and the code server's last words."""
        try:
            return wait_for(what, probe, timeout, interval)
        except TimeoutError as error:
            logs = f"--- daemon ---\n{self.daemon.log_tail()}\n--- code server ---\n{self.server.log_tail()}"
            raise TimeoutError(f"{error}\n{logs}") from None

    def wait_for_run(self, run_id: str, timeout: float = RUN_TIMEOUT) -> dg.DagsterRunStatus:
        def finished():
            run = self.instance.get_run_by_id(run_id)
            return run.status if run is not None and run.is_finished else None

        return self.wait(f"run {run_id} to finish", finished, timeout)

    def cleanup_records(self) -> list[dg.RunRecord]:
        return list(self.instance.get_run_records(dg.RunsFilter(job_name=CLEANUP)))

    def restart_code_server(self) -> None:
        """What a container engine's restart policy does after a crash: the same command, port and environment."""
        self.stopped.append(self.server)
        self.server = processes.code_server(self.port, self.server_env, self.base / "code-server.log").start()
        processes.wait_until_serving(self.port, self.env, self.server)


def instance_yaml(changes: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """deploy/dagster.yaml, with ``changes`` merged into its top-level sections (none: the file unchanged)."""
    text = (DEPLOY / "dagster.yaml").read_text()
    if not changes:
        return text
    settings = yaml.safe_load(text)
    for section, values in changes.items():
        settings[section] = {**settings.get(section, {}), **values}
    return yaml.safe_dump(settings, sort_keys=False)


@contextlib.contextmanager
def deployment_stack(
    mongo_url: str,
    base: Path,
    workload: Workload,
    instance_changes: Mapping[str, Mapping[str, Any]] | None = None,
    pipeline_env: Mapping[str, str] | None = None,
    before_daemon: Callable[[Operator], None] = lambda ops: None,
    prepare_queue: Callable[[Store], None] = lambda store: None,
    daemon_env: Mapping[str, str] | None = None,
    watcher: bool = False,
) -> Iterator[Deployment]:
    """The deployment, the daemon started once ``before_daemon`` has turned on what the test wants; the simulated
    queue completed by ``prepare_queue`` first; ``daemon_env`` adds to the daemon's environment only (e.g. Dagster's
    gRPC timeout of its calls to the code server). The watcher (``zombie_watch_sensor``, running by default) is turned
    off unless ``watcher``: the tests of the cleanups' own paths (the fallback's) want no watch run taking their
    zombies first."""
    home = base / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(instance_yaml(instance_changes))
    client = client_for(mongo_url)
    suffix = uuid.uuid4().hex[:12]
    store = Store.of(client[f"test_prod_queue_{suffix}"], client[f"test_prod_cache_{suffix}"])
    with private_cluster() as cluster, dropped_after(store):
        store.ensure_indexes()
        simulation = simulate(store, workload)
        prepare_queue(store)
        zombies = list(store.jobs.find({ID: {"$in": simulation.zombie_ids}}))
        cluster.create_database("dagster")
        port = free_port()
        instance_env = {
            **cluster.env("dagster"),
            "DAGSTER_HOME": str(home),
            "DAGSTER_MAX_CONCURRENT_RUNS": "10",
            "DAGSTER_DEQUEUE_INTERVAL_SECONDS": "1",
            "ZOMBIE_CODE_SERVER_HOST": "127.0.0.1",
            "ZOMBIE_CODE_SERVER_PORT": str(port),
        }
        # what the code server (and the run workers it launches) reads; the instance's variables too, since
        # every process that opens the instance resolves dagster.yaml's {env: ...} in its own environment
        pipeline = {
            QUEUE_URL_ENV: mongo_url,
            CACHE_URL_ENV: mongo_url,
            QUEUE_DATABASE_ENV: store.jobs.database.name,
            CACHE_DATABASE_ENV: store.cache.database.name,
            KILL_CRON_ENV: EVERY_MINUTE,
            WEBHOOK_URL_ENV: "",
            HOME_ENV: str(base / "zombie_pipeline_home"),
            **(pipeline_env or {}),
        }
        python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, **instance_env, "PYTHONPATH": python_path}  # this checkout's code, however installed
        server_env = {**env, **pipeline}
        server = processes.code_server(port, server_env, base / "code-server.log")
        daemon = processes.daemon(DEPLOY / "workspace.yaml", {**env, **(daemon_env or {})}, base / "daemon.log")
        deployment = None
        try:
            server.start()
            with pytest.MonkeyPatch.context() as patch:
                for name, value in instance_env.items():
                    patch.setenv(name, value)
                processes.wait_until_serving(port, env, server)
                with (
                    dg.DagsterInstance.from_config(str(home)) as instance,
                    operator(instance, DEPLOY / "workspace.yaml") as ops,
                ):
                    if not watcher:
                        ops.stop_sensor(WATCH_SENSOR)
                    before_daemon(ops)
                    daemon.start()
                    deployment = Deployment(store, simulation, zombies, cluster, instance, ops, env, server_env, port,
                                            base, server, daemon)  # fmt: skip
                    yield deployment
        except Exception:
            current = deployment.server if deployment else server
            print(f"--- code server log ---\n{current.log_tail()}\n--- daemon log ---\n{daemon.log_tail()}")
            raise
        finally:
            servers = [*(deployment.stopped if deployment else []), deployment.server if deployment else server]
            pids = daemon.stop() + [pid for tree in servers for pid in tree.stop()]
            survivors = {pid: processes.command_line(pid) for pid in pids if processes.pid_alive(pid)}
            assert survivors == {}, f"processes of the deployment survived the stop: {survivors}"


@contextlib.contextmanager
def dropped_after(store: Store) -> Iterator[None]:
    """A real MongoDB (ZOMBIE_TEST_MONGO_URL) is cleaned up; a server the tests started goes with its storage."""
    try:
        yield
    finally:
        if os.environ.get("ZOMBIE_TEST_MONGO_URL"):
            for database in (store.jobs.database, store.cache.database):
                database.client.drop_database(database.name)


def assert_never_two_cleanups_at_once(deployment: Deployment) -> None:
    """The limit of one cleanup per queue database, over every cleanup the instance ever ran."""
    spans = sorted(
        (record.start_time, record.end_time or dt.datetime.now(dt.UTC).timestamp())
        for record in deployment.cleanup_records()
        if record.start_time is not None
    )
    for (_, end), (next_start, _) in zip(spans, spans[1:]):
        assert end <= next_start, spans
