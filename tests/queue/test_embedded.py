"""The embedded default: one SecantusDB server per project home, shared by every process.

Every server started here is stopped by PID in a fixture teardown or a ``finally``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient

from tests.servers import child_env, kill_recorded_server, pid_alive, wait_until_gone
from zombie_pipeline.config import HOME_ENV
from zombie_pipeline.queue import embedded
from zombie_pipeline.queue.embedded import (
    INSTALL_HINT,
    EmbeddedServerError,
    ServerInfo,
    ensure_server,
    free_port,
    remembered_port,
    running_server,
    start_server,
    stop_server,
)

PYTHON = sys.executable


def ensure_in_subprocesses(home: Path, count: int) -> list[dict]:
    """``count`` separate Python processes call ensure_server at once; each reports what it got."""
    code = textwrap.dedent(
        """
        import json
        from pymongo import MongoClient
        from zombie_pipeline.queue.embedded import ensure_server
        info = ensure_server()
        with MongoClient(info.url) as client:
            note = client["shared"]["notes"].find_one({"_id": "from-parent"})
        print(json.dumps({"pid": info.pid, "port": info.port, "note": note and note["text"]}))
        """
    )
    processes = [
        subprocess.Popen(
            [PYTHON, "-c", code], env=child_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=90)
        assert process.returncode == 0, err
        reports.append(json.loads(out))
    return reports


# --- one server, reused --------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory):
    """A project home whose server is started once for the module."""
    home = tmp_path_factory.mktemp("zp_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(HOME_ENV, str(home))
        try:
            yield home
        finally:
            kill_recorded_server(home)


@pytest.fixture(scope="module")
def shared_server(shared_home) -> ServerInfo:
    return ensure_server()


def test_ensure_server_starts_a_server_in_the_project_home(shared_home, shared_server):
    assert pid_alive(shared_server.pid)
    assert Path(shared_server.storage_path) == shared_home / "data"
    assert json.loads((shared_home / "server.json").read_text())["pid"] == shared_server.pid
    with MongoClient(shared_server.url, serverSelectionTimeoutMS=5_000, document_class=dict) as client:
        assert client.admin.command("ping")["ok"] == 1


def test_a_second_call_reuses_the_running_server(shared_server):
    again = ensure_server()
    assert (again.pid, again.port) == (shared_server.pid, shared_server.port)
    assert running_server() == shared_server


def test_separate_processes_reuse_it_and_see_its_data(shared_home, shared_server):
    with MongoClient(shared_server.url, document_class=dict) as writer:
        writer["shared"]["notes"].replace_one({"_id": "from-parent"}, {"text": "hello"}, upsert=True)

    reports = ensure_in_subprocesses(shared_home, count=3)

    assert reports == [{"pid": shared_server.pid, "port": shared_server.port, "note": "hello"}] * 3


def test_data_written_through_one_client_is_read_through_another(shared_server):
    with (
        MongoClient(shared_server.url, document_class=dict) as one,
        MongoClient(shared_server.url, document_class=dict) as other,
    ):
        one["shared"]["jobs"].insert_many([{"n": n} for n in range(5)])
        assert sorted(doc["n"] for doc in other["shared"]["jobs"].find({}, {"_id": 0})) == list(range(5))


def test_a_second_server_cannot_take_the_same_storage_and_says_where_its_log_is(shared_server, tmp_path):
    log = tmp_path / "second.log"
    with pytest.raises(EmbeddedServerError) as raised:
        start_server(Path(shared_server.storage_path), log_path=log)

    message = str(raised.value)
    assert str(log) in message
    assert "busy" in message.lower()
    assert running_server() == shared_server  # the first one is undisturbed


# --- stop, restart, stale state --------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch) -> Iterator[Path]:
    home = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    try:
        yield home
    finally:
        kill_recorded_server(home)


def test_stop_server_stops_it_and_the_data_survives_a_restart(home):
    first = ensure_server()
    with MongoClient(first.url, document_class=dict) as client:
        client["durable"]["jobs"].insert_one({"_id": 1, "status": "started"})

    stopped = stop_server()

    assert stopped == first
    assert wait_until_gone(first.pid)
    assert not (home / "server.json").exists()
    assert running_server() is None
    assert stop_server() is None  # nothing left to stop

    # a state file left behind by a crashed server is not trusted
    (home / "server.json").write_text(json.dumps(first.__dict__))
    second = ensure_server()
    try:
        assert second.pid != first.pid
        with MongoClient(second.url, document_class=dict) as client:
            assert client["durable"]["jobs"].find_one({"_id": 1}) == {"_id": 1, "status": "started"}
    finally:
        stop_server()
    assert wait_until_gone(second.pid)


def test_a_server_started_again_takes_the_port_it_had_and_one_started_elsewhere_is_remembered(home):
    first = ensure_server()
    stop_server()
    assert wait_until_gone(first.pid) and remembered_port() == first.port
    assert ensure_server().port == first.port
    stop_server()

    asked = free_port()
    moved = ensure_server(port=asked)
    assert moved.port == asked == remembered_port()
    with pytest.raises(EmbeddedServerError, match=f"already runs on port {asked}"):
        ensure_server(port=free_port())  # never a second server on the same storage
    assert running_server() == moved


def test_a_remembered_port_another_process_took_meanwhile_is_refused_not_silently_changed(home):
    first = ensure_server()
    stop_server()
    assert wait_until_gone(first.pid)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", first.port))
        holder.listen()
        with pytest.raises(EmbeddedServerError) as raised:
            ensure_server()

    assert str(raised.value).startswith(f"port {first.port} (where the embedded server of this home ran last) is taken")
    assert "zombie-pipeline db start --port PORT" in str(raised.value)
    assert not (home / "server.json").exists()


@pytest.fixture
def unrelated_process():
    """A process that happens to have the PID a stale state file recorded."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_live_process_that_does_not_answer_is_neither_reused_nor_killed(home, unrelated_process):
    home.mkdir(parents=True)
    stale = {"pid": unrelated_process.pid, "port": free_port(), "storage_path": str(home / "data")}
    (home / "server.json").write_text(json.dumps(stale))

    assert running_server() is None
    assert stop_server() is None

    time.sleep(0.2)
    assert unrelated_process.poll() is None  # still running: stop_server sent it nothing
    assert not (home / "server.json").exists()  # the stale record is gone


# --- clear errors ----------------------------------------------------------------------


def test_a_missing_executable_says_what_to_install_or_set(home, monkeypatch):
    monkeypatch.setattr(embedded, "SERVER_EXECUTABLE", "secantusd-py-not-installed")

    with pytest.raises(EmbeddedServerError) as raised:
        ensure_server()

    assert str(raised.value) == INSTALL_HINT
    assert "pip install" in INSTALL_HINT and "QUEUE_MONGO_URL" in INSTALL_HINT and "CACHE_MONGO_URL" in INSTALL_HINT
    assert not (home / "server.json").exists()


def test_a_taken_port_fails_with_a_message_naming_the_log(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        log = tmp_path / "server.log"

        started = time.monotonic()
        with pytest.raises(EmbeddedServerError) as raised:
            start_server(tmp_path / "data", port=port, log_path=log, timeout_seconds=30)

    assert time.monotonic() - started < 20  # the exit is noticed, not waited out
    message = str(raised.value)
    assert str(log) in message
    assert f"127.0.0.1:{port}" in message
    assert "Address already in use" in message


def test_the_pipeline_writes_to_the_embedded_server_without_retries(shared_server, monkeypatch):
    """It applies a retried write twice when a connection resets as it executes it (the team's reference notes):
    a reset must fail the run, for the next one to complete, rather than count a counter's move twice."""
    from zombie_pipeline.config import QUEUE_URL_ENV
    from zombie_pipeline.defs.resources import Databases

    monkeypatch.delenv(QUEUE_URL_ENV, raising=False)
    database = Databases(queue_database="q").queue()
    assert database.client.options.retry_writes is False
    assert database.client.address == ("127.0.0.1", shared_server.port)
