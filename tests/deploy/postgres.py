"""A private PostgreSQL cluster for a test: its own data directory, 127.0.0.1, a free port, stopped by PID.

``initdb`` refuses to run as root and the tests run as root, so the cluster belongs to the ``postgres``
OS user: its directory is created under the system's temporary directory (the pytest one is private to
root) and handed to that user, and ``initdb`` and ``postgres`` are started as that user. The superuser
``postgres`` has a password and TCP connections must give it (scram-sha-256), as a deployment's would.

    with private_cluster() as cluster:
        cluster.create_database("dagster")
        cluster.env()  # the DAGSTER_PG_* variables deploy/dagster.yaml reads
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2

from zombie_pipeline.queue.embedded import free_port

OS_USER = "postgres"
SUPERUSER = "postgres"
#: Where Debian installs the server when its binaries are not on PATH.
DEBIAN_BIN = Path("/usr/lib/postgresql/15/bin")


def binary(name: str) -> str:
    found = shutil.which(name) or (str(DEBIAN_BIN / name) if (DEBIAN_BIN / name).exists() else None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is neither on PATH nor in {DEBIAN_BIN}: install PostgreSQL 15")
    return found


class PrivateCluster:
    def __init__(self, base: Path, port: int) -> None:
        self.base = base
        self.port = port
        self.data = base / "data"
        self.log_path = base / "postgres.log"
        self.password = secrets.token_hex(12)
        self.process: subprocess.Popen | None = None
        account = pwd.getpwnam(OS_USER)
        self._uid, self._gid = account.pw_uid, account.pw_gid

    def _as_postgres(self) -> dict:
        return {"user": self._uid, "group": self._gid, "extra_groups": [], "cwd": self.base}

    def init(self) -> PrivateCluster:
        password_file = self.base / "superuser-password"
        password_file.write_text(self.password + "\n")
        os.chown(password_file, self._uid, self._gid)
        subprocess.run(
            [binary("initdb"), "-D", str(self.data), "-U", SUPERUSER, f"--pwfile={password_file}",
             "--auth-host=scram-sha-256", "--auth-local=peer", "--encoding=UTF8", "--no-sync"],
            check=True, capture_output=True, timeout=120, **self._as_postgres(),
        )  # fmt: skip
        password_file.unlink()
        return self

    def start(self, timeout: float = 60) -> PrivateCluster:
        options = [
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.base}",
            # a throwaway cluster: nothing to keep across a crash, so no waiting for the disk
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            os.chown(self.log_path, self._uid, self._gid)
            self.process = subprocess.Popen(
                [binary("postgres"), "-D", str(self.data), "-p", str(self.port), *options],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                **self._as_postgres(),
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                self.connect("postgres").close()
                return self
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"postgres did not accept connections within {timeout:.0f} s:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.2)

    def connect(self, database: str):
        return psycopg2.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, password=self.password, dbname=database, connect_timeout=5
        )

    def create_database(self, name: str) -> None:
        connection = self.connect("postgres")
        try:
            connection.autocommit = True  # CREATE DATABASE refuses to run in a transaction
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()

    def env(self, database: str) -> dict[str, str]:
        """The variables deploy/dagster.yaml reads to reach ``database`` on this cluster."""
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USERNAME": SUPERUSER,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_DB": database,
        }

    def stop(self, timeout: float = 30) -> None:
        """Fast shutdown (SIGINT: clients are disconnected, not waited for), SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the postmaster and its backends
            self.process.wait(timeout=10)

    def log_tail(self, characters: int = 3_000) -> str:
        return self.log_path.read_text(errors="replace")[-characters:] if self.log_path.exists() else ""


@contextlib.contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    """A cluster initialized and started for the block, stopped and deleted after it."""
    base = Path(tempfile.mkdtemp(prefix="zombie-pipeline-postgres-"))
    cluster = PrivateCluster(base, free_port())
    try:
        os.chown(base, cluster._uid, cluster._gid)
        yield cluster.init().start()
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(base, ignore_errors=True)
