"""The embedded default: a local SecantusDB server, shared by every process of the project.

With no MongoDB URL configured, the CLI, ``dagster dev`` and every run's
subprocess call :func:`ensure_server`. The first one starts a SecantusDB server
as a separate process (it is GPL software, kept out of our runtime
dependencies); the others find it through a state file and reuse it, so data
written by one run is seen by the next. A file lock keeps two processes from
starting two servers on the same storage. A server started again takes the port
the home's server had last (or the one asked for), so a URL copied from
``db status`` stays right across restarts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zombie_pipeline.config import home

SERVER_EXECUTABLE = "secantusd-py"
INSTALL_HINT = (
    "No MongoDB URL is set (QUEUE_MONGO_URL / CACHE_MONGO_URL) and the embedded server is not "
    "installed. Either install it: pip install -e '.[embedded]' (SecantusDB, GPL), "
    "or set QUEUE_MONGO_URL and CACHE_MONGO_URL to a real MongoDB."
)


class EmbeddedServerError(RuntimeError):
    """The embedded server is missing or would not start; the message says what to do."""


@dataclass(frozen=True)
class ServerInfo:
    pid: int
    port: int
    storage_path: str

    @property
    def url(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"


def _state_file(base: Path) -> Path:
    return base / "server.json"


def _port_file(base: Path) -> Path:
    """The port the home's server had last: kept when it stops, taken again when it starts."""
    return base / "server.port"


def remembered_port(base: Path | None = None) -> int | None:
    """The port the home's server was last started on, or None before its first start."""
    try:
        return int(_port_file(base or home()).read_text())
    except (OSError, ValueError):
        return None


def port_in_use(port: int) -> bool:
    """True when something listens on 127.0.0.1:``port`` (a socket binds there only if nothing does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: past connections do not count
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


#: How long a start waits for its port to be released: a server stopped a moment ago may still hold it (its
#: processes ending after the one whose PID it recorded, on a loaded host).
PORT_RELEASE_SECONDS = 10.0


def port_freed(port: int, timeout_seconds: float) -> bool:
    """True once nothing listens on 127.0.0.1:``port``, within ``timeout_seconds``."""
    deadline = time.monotonic() + timeout_seconds
    while port_in_use(port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def find_executable() -> str | None:
    beside_python = Path(sys.executable).parent / SERVER_EXECUTABLE
    if beside_python.exists():
        return str(beside_python)
    return shutil.which(SERVER_EXECUTABLE)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited process its parent has not reaped yet (a zombie) still "exists"
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _answers(port: int, timeout: float = 1.0) -> bool:
    """True when a MongoDB-wire server answers ``ping`` on the port."""
    import pymongo

    client: pymongo.MongoClient[Any] = pymongo.MongoClient(
        "127.0.0.1", port, directConnection=True, serverSelectionTimeoutMS=int(timeout * 1000)
    )
    try:
        client.admin.command("ping")
        return True
    except pymongo.errors.PyMongoError:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def _locked(base: Path) -> Iterator[None]:
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def running_server(base: Path | None = None) -> ServerInfo | None:
    """The server recorded in the state file, if its process is alive and answers."""
    base = base or home()
    try:
        info = ServerInfo(**json.loads(_state_file(base).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if _pid_alive(info.pid) and _answers(info.port):
        return info
    return None


def start_server(
    storage_path: Path,
    port: int | None = None,
    log_path: Path | None = None,
    timeout_seconds: float = 60.0,
    detach: bool = True,
) -> tuple[subprocess.Popen[Any], ServerInfo]:
    """Start a SecantusDB server on 127.0.0.1 and wait until it answers."""
    executable = find_executable()
    if executable is None:
        raise EmbeddedServerError(INSTALL_HINT)
    port = port or free_port()
    storage_path.mkdir(parents=True, exist_ok=True)
    log_path = log_path or storage_path.parent / "server.log"
    command = [
        executable,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--storage-path",
        str(storage_path),
        "--sync-on-commit",
        "--log-level",
        "WARNING",
    ]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=storage_path.parent,
            start_new_session=detach,  # outlives the CLI call or the run that started it
        )
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-800:].strip()
            raise EmbeddedServerError(
                f"the embedded server exited with code {process.returncode} before answering "
                f"on 127.0.0.1:{port}. Its log ({log_path}) ends with:\n{tail}"
            )
        if _answers(port, timeout=0.5):
            return process, ServerInfo(pid=process.pid, port=port, storage_path=str(storage_path))
        time.sleep(0.2)
    process.terminate()
    raise EmbeddedServerError(
        f"the embedded server did not answer on 127.0.0.1:{port} within {timeout_seconds:.0f} s; see {log_path}"
    )


def ensure_server(base: Path | None = None, port: int | None = None) -> ServerInfo:
    """Reuse the project's running server, or start one on ``port``, else on the port it had last, else on a free
    one. Safe to call from many processes."""
    base = base or home()
    with _locked(base):
        info = running_server(base)
        if info is not None:
            if port is not None and port != info.port:
                raise EmbeddedServerError(
                    f"the embedded server of {base} already runs on port {info.port} (pid {info.pid}): stop it first "
                    f"(zombie-pipeline db stop), then start it on port {port}"
                )
            return info
        chosen = port or remembered_port(base)
        if chosen is not None and not port_freed(chosen, PORT_RELEASE_SECONDS):
            why = "asked for" if port else "where the embedded server of this home ran last"
            raise EmbeddedServerError(
                f"port {chosen} ({why}) is taken by another process on 127.0.0.1: free it, or start the server on "
                "another port: zombie-pipeline db start --port PORT"
            )
        _, info = start_server(base / "data", port=chosen, log_path=base / "server.log")
        _state_file(base).write_text(json.dumps(info.__dict__))
        _port_file(base).write_text(str(info.port))
        return info


def stop_server(base: Path | None = None, timeout_seconds: float = 30.0) -> ServerInfo | None:
    """Stop the project's server (by the PID it recorded); return what was stopped."""
    base = base or home()
    with _locked(base):
        try:
            info = ServerInfo(**json.loads(_state_file(base).read_text()))
        except (OSError, ValueError, TypeError):
            return None
        # a stale state file's PID may belong to an unrelated process by now: only signal a server that answers
        if not (_pid_alive(info.pid) and _answers(info.port)):
            _state_file(base).unlink(missing_ok=True)
            return None
        if _pid_alive(info.pid):
            os.kill(info.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_seconds
            while _pid_alive(info.pid) and time.monotonic() < deadline:
                _reap(info.pid)
                time.sleep(0.2)
            if _pid_alive(info.pid):
                os.kill(info.pid, signal.SIGKILL)
                _reap(info.pid)
        _state_file(base).unlink(missing_ok=True)
        return info


def stop_process(process: subprocess.Popen[Any], timeout_seconds: float = 30.0) -> None:
    """Stop a server process this process started: SIGTERM, then SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _reap(pid: int) -> None:
    """Collect the exit status when we are the parent (a zombie process still 'exists')."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
