"""Start ``dagster dev`` on a free port with a temporary DAGSTER_HOME, talk GraphQL to it, stop it.

Used by the end-to-end test and by ``scripts/screenshots.py``. ``dagster dev``
is started in its own session so that its whole process tree (webserver,
daemon, code servers, run workers) can be found and stopped by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LOCATION = "zombie_pipeline"
REPOSITORY = "__repository__"

# Runs start at once (no queue to wait for); no first-visit modal in screenshots.
DAGSTER_YAML = """\
nux:
  enabled: false
telemetry:
  enabled: false
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
"""


def watcher_off(base: Path) -> dict[str, str]:
    """The environment of a ``dagster dev`` whose policy file turns the watcher off (``watch_deadlines: false``): for a
    test of the cleanups launched by hand, whose zombies a watch run would otherwise take first."""
    from zombie_pipeline.config import POLICY_FILE_ENV

    path = base / "watcher-off.yaml"
    path.write_text("watch_deadlines: false\n")
    return {POLICY_FILE_ENV: str(path)}


def repository_selector() -> dict[str, str]:
    return {"repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    """Call ``probe`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie process has exited: only its parent's wait is missing
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class DagsterDev:
    """One ``dagster dev`` process tree; ``env`` is added to this process's environment."""

    def __init__(self, home: Path, port: int, env: dict[str, str]) -> None:
        self.home = home
        self.port = port
        self.env = env
        self.process: subprocess.Popen | None = None
        self.log_path = home / "dagster-dev.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> DagsterDev:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "dagster.yaml").write_text(DAGSTER_YAML)
        env = {**os.environ, **self.env, "DAGSTER_HOME": str(self.home)}
        dagster = Path(sys.executable).parent / "dagster"
        command = [str(dagster), "dev", "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(self.port)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for("the code location to load in dagster dev", self._location_loaded, timeout)
        return self

    def _location_loaded(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"dagster dev exited with {self.process.returncode}; see {self.log_path}:\n{self.log_tail()}"
            )
        try:
            data = self.graphql(
                "query { workspaceOrError { ... on Workspace { locationEntries { name "
                "locationOrLoadError { __typename ... on PythonError { message } } } } } }"
            )
        except (OSError, urllib.error.URLError, ValueError):
            return False
        for entry in data["workspaceOrError"].get("locationEntries", []):
            if entry["name"] == LOCATION:
                kind = (entry["locationOrLoadError"] or {}).get("__typename")
                if kind == "PythonError":
                    raise RuntimeError(f"the code location failed to load: {entry['locationOrLoadError']['message']}")
                return kind == "RepositoryLocation"
        return False

    def log_tail(self, characters: int = 3_000) -> str:
        return self.log_path.read_text(errors="replace")[-characters:] if self.log_path.exists() else ""

    def graphql(self, query: str, variables: dict[str, Any] | None = None, timeout: float = 30) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as error:  # GraphQL validation errors come back as HTTP 400/500
            raise RuntimeError(f"GraphQL HTTP {error.code}: {error.read().decode(errors='replace')[:2000]}") from None
        if answer.get("errors"):
            raise RuntimeError(f"GraphQL errors: {answer['errors']}")
        return answer["data"]

    def stop(self, timeout: float = 30) -> list[int]:
        """Stop every process of the tree, by PID; return the PIDs.

        ``dagster dev`` first (it shuts its webserver, daemon and code servers
        down), then SIGTERM and, after a grace period, SIGKILL for anything of
        the tree still alive (run workers, orphans).
        """
        if self.process is None:
            return []
        pids = [self.process.pid, *descendants(self.process.pid)]
        _signal(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout / 2)
        except subprocess.TimeoutExpired:
            pass
        for pid in pids:
            if _alive(pid):
                _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout / 2
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.3)
        for pid in pids:
            if _alive(pid):
                _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10  # a killed process is gone once the kernel has torn it down: soon, not at once
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.1)
        if self.process.poll() is None:
            self.process.wait(timeout=10)
        return pids

    def alive(self, pids: list[int]) -> list[int]:
        return [pid for pid in pids if _alive(pid)]


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


# --- GraphQL operations the test and the screenshot script share -------------------------------

RUN_STATUS = "query($runId: ID!) { runOrError(runId: $runId) { __typename ... on Run { status } } }"

LAUNCH_RUN = """
mutation($params: ExecutionParams!) {
  launchPipelineExecution(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
  }
}
"""

RUNS = """
query($filter: RunsFilter) {
  runsOrError(filter: $filter) { ... on Runs { results { runId status jobName tags { key value } } } }
}
"""

FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}


def launch(
    dev: DagsterDev, job: str, run_config: dict | None = None, tags: dict | None = None, asset_selection=None
) -> str:
    params: dict[str, Any] = {
        "selector": {**repository_selector(), "jobName": job},
        "runConfigData": run_config or {},
        "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
    }
    if asset_selection is not None:
        params["selector"]["assetSelection"] = [{"path": path} for path in asset_selection]
    result = dev.graphql(LAUNCH_RUN, {"params": params})["launchPipelineExecution"]
    if result["__typename"] != "LaunchRunSuccess":
        raise RuntimeError(f"launch of {job} failed: {result}")
    return result["run"]["runId"]


def run_status(dev: DagsterDev, run_id: str) -> str:
    return dev.graphql(RUN_STATUS, {"runId": run_id})["runOrError"]["status"]


def wait_for_run(dev: DagsterDev, run_id: str, timeout: float = 120) -> str:
    return wait_for(f"run {run_id} to finish", lambda: (s := run_status(dev, run_id)) in FINISHED and s, timeout)


def runs(dev: DagsterDev, job: str | None = None, tags: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Runs, newest first, of ``job`` and carrying every one of ``tags``."""
    run_filter: dict[str, Any] = {}
    if job:
        run_filter["pipelineName"] = job
    if tags:
        run_filter["tags"] = [{"key": key, "value": value} for key, value in tags.items()]
    return dev.graphql(RUNS, {"filter": run_filter})["runsOrError"]["results"]
