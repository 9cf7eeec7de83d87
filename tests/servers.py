"""The one way a test gets a MongoDB-wire server of its own: SecantusDB on 127.0.0.1, a free port, its own storage
(and an HTTP server for the tests of what is POSTed: :func:`http_server`).

The session's server (conftest ``mongo_url``) comes from here, and so do the
servers of the suites that need one of their own: the fault scenarios stop,
kill and restart theirs on the same port and storage; the secrets suite needs
authentication switched on. Whoever starts a server stops it, by its process.

    with running_server(tmp_path) as server:
        client = MongoClient(server.url)
        server.stop(); server.start()  # same port, same storage
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pymongo import MongoClient
from pymongo.database import Database

from zombie_pipeline.config import CACHE_URL_ENV, HOME_ENV, QUEUE_URL_ENV
from zombie_pipeline.queue import embedded
from zombie_pipeline.queue.connections import close_clients
from zombie_pipeline.queue.embedded import (
    ServerInfo,
    free_port,
    start_server,
    stop_process,
    stop_server,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

#: A real MongoDB to run the suite against instead of the server the session starts (conftest ``mongo_url``).
TEST_URL_ENV = "ZOMBIE_TEST_MONGO_URL"
#: Read by the server from its working directory, the parent of its storage (see ``embedded.start_server``).
SERVER_CONFIG = "secantusd.toml"


class LocalServer:
    """A SecantusDB server on one port and one storage under ``base``, started and stopped by this process."""

    def __init__(self, base: Path, port: int | None = None, users: Mapping[str, str] | None = None) -> None:
        self.base = base
        self.port = port or free_port()
        self.users = dict(users or {})
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        """The URL without credentials (a server with users refuses it any command but a ping)."""
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def start(self) -> LocalServer:
        if self.users and not (self.base / SERVER_CONFIG).exists():
            self._create_users()
        self.process, _ = start_server(
            self.base / "data", port=self.port, log_path=self.base / "server.log", detach=False
        )
        self.starts += 1
        return self

    def _create_users(self) -> None:
        """SecantusDB takes users created without authentication, then a restart with it on."""
        process, info = start_server(
            self.base / "data", port=self.port, log_path=self.base / "server.log", detach=False
        )
        try:
            with MongoClient(info.url, document_class=dict) as client:
                for user, password in self.users.items():
                    client.admin.command("createUser", user, pwd=password, roles=[{"role": "root", "db": "admin"}])
        finally:
            stop_process(process)
        (self.base / SERVER_CONFIG).write_text("[server]\nauth = true\n")

    def stop(self) -> None:
        """SIGTERM, as an operator or an orchestrator stops a database (SIGKILL if it lingers)."""
        if self.process is not None:
            stop_process(self.process)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: the database host loses power; only ``--sync-on-commit`` keeps acknowledged writes."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None


@contextlib.contextmanager
def running_server(
    base: Path, port: int | None = None, users: Mapping[str, str] | None = None
) -> Iterator[LocalServer]:
    """A :class:`LocalServer` started for the block and stopped after it, whatever the block did to it."""
    server = LocalServer(base, port, users).start()
    try:
        yield server
    finally:
        server.stop()


def on_real_mongodb() -> bool:
    return bool(os.environ.get(TEST_URL_ENV))


@contextlib.contextmanager
def fresh_databases(client: MongoClient, drop: bool) -> Iterator:
    """Makes databases with names of their own (``make("queue")``); with ``drop``, they are dropped at the end.

    A server started by the tests is thrown away with its storage: dropping on it only costs time
    (SecantusDB drops a large database slowly); a real MongoDB given by URL is cleaned up.
    """
    names: list[str] = []

    def make(prefix: str) -> Database:
        name = f"test_{prefix}_{uuid.uuid4().hex[:12]}"
        names.append(name)
        return client[name]

    try:
        yield make
    finally:
        if drop:
            for name in names:
                client.drop_database(name)


# --- the embedded server of a project home (``embedded.ensure_server``), for its own suites and the CLI's ---------


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def is_embedded_server(pid: int) -> bool:
    try:
        return embedded.SERVER_EXECUTABLE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def kill_recorded_server(home: Path) -> None:
    """Teardown: stop the server the home's state file names (by its PID), and only that."""
    state = home / "server.json"
    recorded = json.loads(state.read_text()) if state.exists() else {}
    pid = recorded.get("pid")
    if "port" in recorded:
        close_clients(ServerInfo(**recorded).url)
    try:
        stop_server(home)
    finally:
        if pid is not None and pid_alive(pid) and is_embedded_server(pid):
            os.kill(pid, signal.SIGKILL)


def child_env(home: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in (QUEUE_URL_ENV, CACHE_URL_ENV)}
    env[HOME_ENV] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that does not log each request to stderr."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """A real HTTP server on 127.0.0.1 and a free port, serving ``handler`` from a thread; its port. Stopped on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
