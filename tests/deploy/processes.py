"""The production processes of the deployment, started by a test: the code server and the daemon.

Each starts in a session of its own, so that its whole tree (the code server's gRPC subprocess and the run
workers it launches) can be found from its PID and stopped, the stragglers included, by PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.e2e.harness import descendants, wait_for
from tests.servers import pid_alive as pid_alive  # the deployment tests ask processes.pid_alive

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The code location's name, in the code server's command and in deploy/workspace.yaml.
LOCATION = "zombie_pipeline"
REPOSITORY = "__repository__"


def executable(name: str) -> str:
    """A console script of this environment (``dagster``, ``dagster-daemon``)."""
    return str(Path(sys.executable).parent / name)


class ProcessTree:
    """One command started in its own session, its output in ``log_path``."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self.command = list(command)
        self.env = dict(env)
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.pids: list[int] = []
        self.crashed = False

    def start(self) -> ProcessTree:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=REPO_ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.command[:3]} exited with {self.process.returncode}:\n{self.log_tail()}")

    def crash(self) -> list[int]:
        """SIGKILL to the root and its whole tree at once, as when a container dies with its processes; the PIDs."""
        assert self.process is not None and self.process.poll() is None, "crash a running tree"
        self.pids = [self.process.pid, *descendants(self.process.pid)]
        for pid in self.pids:
            _signal(pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.crashed = True
        return self.pids

    def stop(self, timeout: float = 30) -> list[int]:
        """SIGTERM to the root, then to whatever of its tree outlives it, SIGKILL after ``timeout``; the PIDs."""
        if self.process is None:
            return []
        if self.crashed:  # its root was killed: what it had started (a run worker) may outlive it, orphaned
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.alive():
                time.sleep(0.2)
            self._kill_survivors()
            return self.pids
        self.pids = [self.process.pid, *descendants(self.process.pid)]
        _signal(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout / 2)
        except subprocess.TimeoutExpired:
            pass
        self.pids += [pid for pid in descendants(self.process.pid) if pid not in self.pids]
        for pid in self.pids:
            if pid_alive(pid):
                _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout / 2
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.2)
        self._kill_survivors()
        if self.process.poll() is None:
            self.process.wait(timeout=10)
        return self.pids

    def _kill_survivors(self) -> None:
        for pid in self.alive():
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10  # a killed process is gone once the kernel has torn it down: soon, not at once
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.1)

    def alive(self) -> list[int]:
        return [pid for pid in self.pids if pid_alive(pid)]

    def log_tail(self, characters: int = 4_000) -> str:
        return self.log_path.read_text(errors="replace")[-characters:] if self.log_path.exists() else ""


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def code_server(port: int, env: Mapping[str, str], log_path: Path) -> ProcessTree:
    """The Dockerfile's command, on 127.0.0.1: ``dagster code-server start -m zombie_pipeline.definitions -a defs``."""
    command = [
        executable("dagster"), "code-server", "start", "-h", "127.0.0.1", "-p", str(port),
        "-m", "zombie_pipeline.definitions", "-a", "defs", "--location-name", LOCATION,
    ]  # fmt: skip
    return ProcessTree(command, env, log_path)


def wait_until_serving(port: int, env: Mapping[str, str], server: ProcessTree, timeout: float = 120) -> None:
    """The Dockerfile's HEALTHCHECK (and the Helm chart's probes): ``dagster api grpc-health-check``."""

    def healthy() -> bool:
        server.check_running()
        probe = subprocess.run(
            [executable("dagster"), "api", "grpc-health-check", "-h", "127.0.0.1", "-p", str(port)],
            env=dict(env), capture_output=True, timeout=60,
        )  # fmt: skip
        return probe.returncode == 0

    wait_for("the code server to answer its health check", healthy, timeout, interval=0.5)


def daemon_command(workspace_yaml: Path | str) -> list[str]:
    """``dagster-daemon run`` on the deployment's workspace (deploy/docker-compose.yaml runs the same)."""
    return ["dagster-daemon", "run", "-w", str(workspace_yaml)]


def webserver_command(workspace_yaml: Path | str, host: str, port: int) -> list[str]:
    """``dagster-webserver`` on the deployment's workspace (deploy/docker-compose.yaml runs the same)."""
    return ["dagster-webserver", "-h", host, "-p", str(port), "-w", str(workspace_yaml)]


def daemon(workspace_yaml: Path, env: Mapping[str, str], log_path: Path) -> ProcessTree:
    """``dagster-daemon run`` on the deployment's workspace: schedules, sensors, run queue, monitoring, retries."""
    command = daemon_command(workspace_yaml)
    return ProcessTree([executable(command[0]), *command[1:]], env, log_path)


def webserver(workspace_yaml: Path, port: int, env: Mapping[str, str], log_path: Path) -> ProcessTree:
    """The UI on 127.0.0.1, reading the same instance and workspace."""
    command = webserver_command(workspace_yaml, "127.0.0.1", port)
    return ProcessTree([executable(command[0]), *command[1:]], env, log_path)


def command_line(pid: int) -> str:
    """What a process runs, for a message ('' once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
