"""Run the deployment's real client (dataset-viewer's ``libcommon``) from the tests.

``scripts/deployment_client.py setup`` puts that commit's libcommon in a virtualenv of its own
under ``$ZOMBIE_DEPLOYMENT_CACHE/<label>/`` (default ``~/.cache/zombie-pipeline/deployment/<label>/``); ``driver.py``
runs inside it and answers JSON actions. Here, :class:`DeploymentClient` starts the driver once
and sends it actions::

    client = DeploymentClient("2023", mongo_url, queue_db="q", cache_db="c")
    ids = client.run("create_jobs", jobs=[{"type": "/splits", "dataset": "user/ds"}])["job_ids"]
    assert client.run("load_all")["ok"]

:func:`missing_reason` says why a label cannot run and how to set it up: its tests skip with it where the package
registry did not provide the era's pins (:func:`registry_failure`), and anywhere but in CI; in CI they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().with_name("driver.py")
SETUP_SCRIPT = REPO / "scripts" / "deployment_client.py"
CACHE_ENV = "ZOMBIE_DEPLOYMENT_CACHE"
MANIFEST = "deployment.json"
#: Written by the setup where the package registry did not provide an era's pins: the one reason a test may skip in CI.
FAILURE = "deployment-failure.json"
#: Every era of the deployment's client the tests drive: early 2023 and today's, and the three queues between.
LABELS = ("current", "2023", "2023-07", "2023-12", "2024-06")
#: The eras whose client has a backfill rule, a worker's finish and git-branch locks (``libcommon.orchestrator``).
ERAS = ("2023-07", "2023-12", "2024-06")
DEFAULT_TIMEOUT_SECONDS = 120.0


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).resolve()
    # the machine's cache, shared by every clone of the repository (CI's included): a set-up era is reused
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zombie-pipeline" / "deployment"


def deployment_dir(label: str) -> Path:
    return cache_root() / label


def python_of(label: str) -> Path:
    return deployment_dir(label) / "venv" / "bin" / "python"


def manifest(label: str) -> dict[str, Any] | None:
    path = deployment_dir(label) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def setup_command(label: str) -> str:
    return f"python scripts/deployment_client.py setup --label {label} (or setup --all, as .ci/run does)"


def registry_failure(label: str) -> str | None:
    """Why the package registry did not provide the era's pins, as its setup recorded it; None if it did."""
    path = deployment_dir(label) / FAILURE
    return str(json.loads(path.read_text())["reason"]) if path.exists() else None


def _pinned_now(label: str) -> list[str]:
    """The requirements the setup script pins today for the era's extracted source."""
    spec = importlib.util.spec_from_file_location("deployment_client_setup", SETUP_SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return list(script.pinned_requirements(deployment_dir(label) / "source", [])[0])


def missing_reason(label: str) -> str | None:
    """None when the label is ready, else why not and the command that sets it up."""
    failure = registry_failure(label)
    if failure is not None:
        return f"the package registry did not provide the pins of deployment client {label!r}: {failure[-1500:]}"
    where = deployment_dir(label)
    ready = manifest(label)
    if ready is None or not python_of(label).exists():
        return (
            f"deployment client {label!r} not set up (no {where / MANIFEST}): run {setup_command(label)}"
            f"{'' if CACHE_ENV in os.environ else f' (or set {CACHE_ENV} to a folder holding it)'}"
        )
    if ready.get("requirements") != _pinned_now(label):
        return f"deployment client {label!r} in {where} was set up with other requirements than today's: run " + (
            setup_command(label)
        )
    return None


class DriverError(RuntimeError):
    """An action failed inside the driver; ``type`` is the exception's class name there."""

    def __init__(self, action: str, error: dict[str, Any]) -> None:
        self.action = action
        self.type = error.get("type", "")
        self.message = error.get("message", "")
        self.remote_traceback = error.get("traceback", "")
        super().__init__(f"{action}: {self.type}: {self.message}\n{self.remote_traceback}")


class DeploymentClient:
    """One driver process in the deployment venv of ``label``, connected to one queue and cache DB.

    ``run(action, **args)`` returns the action's parsed JSON result and raises :class:`DriverError`
    when the action failed; ``use(queue_db, cache_db)`` points the same process at other databases
    (cheaper than a new process: importing the current libcommon takes seconds).
    """

    def __init__(
        self,
        label: str,
        mongo_url: str,
        queue_db: str,
        cache_db: str,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        reason = missing_reason(label)
        if reason:
            raise FileNotFoundError(reason)
        self.label = label
        self.manifest = manifest(label)
        self.timeout_seconds = timeout_seconds
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen(
            [
                str(python_of(label)),
                str(DRIVER),
                "--serve",
                "--mongo-url",
                mongo_url,
                "--queue-db",
                queue_db,
                "--cache-db",
                cache_db,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._next_id = 0
        self.queue_db, self.cache_db = queue_db, cache_db

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._answers.put(line)
        self._answers.put(None)

    def stderr_tail(self, lines: int = 40) -> str:
        self._stderr.seek(0)
        return "\n".join(self._stderr.read().splitlines()[-lines:])

    def request(self, action: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one action; the raw answer ``{"ok": ..., "result" | "error": ...}``."""
        if self._process.poll() is not None:
            raise RuntimeError(f"driver {self.label!r} has exited:\n{self.stderr_tail()}")
        self._next_id += 1
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"id": self._next_id, "action": action, "args": args or {}}) + "\n")
        self._process.stdin.flush()
        try:
            line = self._answers.get(timeout=self.timeout_seconds)
        except queue.Empty:
            self.close()
            raise TimeoutError(f"driver {self.label!r}: no answer to {action} in {self.timeout_seconds} s") from None
        if line is None:
            raise RuntimeError(f"driver {self.label!r} exited during {action}:\n{self.stderr_tail()}")
        answer = json.loads(line)
        if answer.get("id") != self._next_id:
            raise RuntimeError(f"driver {self.label!r}: answer {answer.get('id')} to request {self._next_id}")
        return answer

    def run(self, action: str, **args: Any) -> Any:
        answer = self.request(action, args)
        if not answer["ok"]:
            raise DriverError(action, answer["error"])
        return answer["result"]

    def use(self, queue_db: str, cache_db: str) -> None:
        self.run("connect", queue_db=queue_db, cache_db=cache_db)
        self.queue_db, self.cache_db = queue_db, cache_db

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            try:
                self._process.stdin.close()
                self._process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        self._stderr.close()

    def __enter__(self) -> DeploymentClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
