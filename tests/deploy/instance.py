"""What an operator does to the production instance, done by the test in process.

Starting a schedule or a sensor and launching a job are what ``dagster schedule start``, ``dagster sensor
start`` and ``dagster job launch`` do with ``-w deploy/workspace.yaml``: load the code location from the code
server, then record the state (or the queued run) in the instance's PostgreSQL storage, where the daemon
reads it. Done here in process, with the calls those commands make (Dagster's own, pinned with it), so two
launches are a few milliseconds apart and not two interpreter start-ups.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
from dagster._cli.job import _create_run, execute_launch_command
from dagster._cli.workspace.cli_target import get_remote_job_from_remote_repo
from dagster._core.remote_representation.external import RemoteRepository
from dagster._core.scheduler.instigation import InstigatorTick
from dagster._core.workspace.context import BaseWorkspaceRequestContext, WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster_shared.cli import WorkspaceOpts

from tests.deploy.processes import LOCATION, REPOSITORY


class Operator:
    def __init__(
        self, instance: dg.DagsterInstance, workspace_yaml: Path, workspace: BaseWorkspaceRequestContext
    ) -> None:
        self.instance = instance
        self.workspace_yaml = workspace_yaml
        self.workspace = workspace
        self.repository: RemoteRepository = workspace.get_code_location(LOCATION).get_repository(REPOSITORY)

    def start_schedule(self, name: str) -> None:
        self.instance.start_schedule(self.repository.get_schedule(name))

    def start_sensor(self, name: str) -> None:
        self.instance.start_sensor(self.repository.get_sensor(name))

    def stop_sensor(self, name: str) -> None:
        sensor = self.repository.get_sensor(name)
        self.instance.stop_sensor(sensor.get_remote_origin_id(), sensor.selector_id, sensor)

    def schedule_ticks(self, name: str) -> list[InstigatorTick]:
        schedule = self.repository.get_schedule(name)
        return list(self.instance.get_ticks(schedule.get_remote_origin_id(), schedule.selector_id))

    def sensor_ticks(self, name: str) -> list[InstigatorTick]:
        sensor = self.repository.get_sensor(name)
        return list(self.instance.get_ticks(sensor.get_remote_origin_id(), sensor.selector_id))

    def launch(
        self, job_name: str, tags: dict[str, str] | None = None, run_config: dict | None = None
    ) -> dg.DagsterRun:
        """``dagster job launch -j JOB -w deploy/workspace.yaml [--tags JSON] [--config-json JSON]``: the run is
        queued; the daemon launches it."""
        return execute_launch_command(
            instance=self.instance, workspace_opts=WorkspaceOpts(workspace=[str(self.workspace_yaml)]), job_name=job_name,
            tags=json.dumps(tags) if tags else None, config_json=json.dumps(run_config) if run_config else None,
        )  # fmt: skip

    def create(self, job_name: str) -> dg.DagsterRun:
        """The first half of ``dagster job launch``: the run created from the code server's plan, NOT_STARTED."""
        location = self.workspace.get_code_location(LOCATION)
        remote_job = get_remote_job_from_remote_repo(self.repository, job_name)
        return _create_run(instance=self.instance, code_location=location, remote_repo=self.repository,
                           remote_job=remote_job, run_config={}, tags=None, op_selection=None, run_id=None)  # fmt: skip

    def submit(self, run_id: str) -> dg.DagsterRun:
        """The second half: the run queued (the run queue's enqueue event, no call to the code server)."""
        return self.instance.submit_run(run_id, self.workspace)


@contextlib.contextmanager
def operator(instance: dg.DagsterInstance, workspace_yaml: Path) -> Iterator[Operator]:
    """The code location loaded from the code server that ``workspace_yaml`` names."""
    with WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[str(workspace_yaml)])) as process:
        workspace = process.create_request_context()
        error = workspace.get_code_location_error(LOCATION)
        if error is not None:
            raise RuntimeError(f"the code location did not load: {error.to_string()}")
        yield Operator(instance, workspace_yaml, workspace)
