"""The command line: the embedded server's ``db`` commands; nothing written where it was not asked; errors in one line.

``simulate`` and ``demo`` run, with credentials in their URLs, in tests/queue/test_secrets.py.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.faults.proxy import WRITES, FaultProxy, Trigger
from tests.helpers import found
from tests.servers import child_env, kill_recorded_server, wait_until_gone
from zombie_pipeline.app import cli
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    DAGSTER_HOME_ENV,
    HOME_ENV,
    MONGO_TIMEOUT_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
)
from zombie_pipeline.queue import embedded
from zombie_pipeline.queue.cache import DEFAULT_CACHE_COLLECTION, Cache
from zombie_pipeline.queue.embedded import INSTALL_HINT, ServerInfo, free_port
from zombie_pipeline.queue.jobs import DEFAULT_JOBS_COLLECTION, ID, Job, Status
from zombie_pipeline.queue.locks import LOCKS_COLLECTION, Lock
from zombie_pipeline.queue.past_jobs import PAST_JOBS_COLLECTION, PastJob
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.marks import SIMULATED_WORKERS_COLLECTION
from zombie_pipeline.simulation.shapes import cache_document, job_document
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workload import Workload

PYTHON = sys.executable
_CONSOLE_SCRIPT = Path(sys.executable).parent / "zombie-pipeline"
# the installed console script; the same main() through -m when the package is not installed
CLI = [str(_CONSOLE_SCRIPT)] if _CONSOLE_SCRIPT.exists() else [PYTHON, "-m", "zombie_pipeline.app.cli"]


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=child_env(home), capture_output=True, text=True, timeout=120)


def test_cli_db_start_status_stop(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    try:
        assert cli.main(["db", "status"]) == 1
        assert "no embedded server running" in capsys.readouterr().out

        started = run_cli(home, "db", "start")
        assert started.returncode == 0, started.stderr
        info = ServerInfo(**json.loads((home / "server.json").read_text()))
        assert f"pid {info.pid}" in started.stdout and info.url in started.stdout

        status = run_cli(home, "db", "status")
        assert status.returncode == 0
        assert f"pid {info.pid}" in status.stdout

        stopped = run_cli(home, "db", "stop")
        assert stopped.returncode == 0
        assert f"stopped embedded server pid {info.pid}" in stopped.stdout
        assert wait_until_gone(info.pid)
        assert cli.main(["db", "status"]) == 1
    finally:
        kill_recorded_server(home)


def test_the_embedded_server_keeps_its_port_across_restarts_and_takes_the_one_asked_for(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    asked = free_port()
    try:
        assert cli.main(["db", "start"]) == 0
        first = ServerInfo(**json.loads((home / "server.json").read_text()))
        assert cli.main(["db", "stop"]) == 0 and wait_until_gone(first.pid)
        assert cli.main(["db", "start"]) == 0
        again = ServerInfo(**json.loads((home / "server.json").read_text()))
        assert again.pid != first.pid and again.url == first.url  # the URL a person copied still works

        assert cli.main(["db", "start", "--port", str(asked)]) == 2  # it runs elsewhere: said, nothing stopped
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and f"already runs on port {first.port}" in error and "db stop" in error
        assert cli.main(["db", "stop"]) == 0 and wait_until_gone(again.pid)
        assert cli.main(["db", "start", "--port", str(asked)]) == 0
        assert cli.main(["db", "stop"]) == 0
        # the port asked for is the one remembered; started at once after the stop, as `db stop && db start` does
        assert cli.main(["db", "start"]) == 0
        assert ServerInfo(**json.loads((home / "server.json").read_text())).port == asked
        assert f"127.0.0.1:{asked}" in capsys.readouterr().out
    finally:
        kill_recorded_server(home)


def test_a_port_taken_by_another_process_is_refused_in_one_line_saying_how_to_choose_another(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setattr(embedded, "PORT_RELEASE_SECONDS", 1.0)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]

        started = time.monotonic()
        assert cli.main(["db", "start", "--port", str(port)]) == 2
        assert time.monotonic() - started >= 1.0  # a port held for longer than a stopping server's release

    error = capsys.readouterr().err
    assert (
        error.startswith(f"zombie-pipeline: port {port} (asked for) is taken by another process")
        and error.count("\n") == 1
    )
    assert "zombie-pipeline db start --port PORT" in error
    assert not (tmp_path / "home" / "server.json").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["db", "status", "--port", "4000"], "--port applies to db start only"),
        (["db", "start", "--port", "70000"], "--port must be a TCP port (1 to 65535), got 70000"),
    ],
)
def test_a_port_where_it_means_nothing_is_refused(args, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))

    assert cli.main(args) == 2

    error = capsys.readouterr().err
    assert error.startswith(f"zombie-pipeline: {expected}") and error.count("\n") == 1


def test_cli_without_server_or_url_prints_what_to_do_not_a_traceback(tmp_path):
    code = (
        "import sys, zombie_pipeline.queue.embedded as e; e.SERVER_EXECUTABLE = 'secantusd-py-not-installed'; "
        "from zombie_pipeline.app.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [PYTHON, "-c", code, "simulate", "--finished", "10"],
        env=child_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 2
    assert result.stderr.strip() == f"zombie-pipeline: {INSTALL_HINT}"
    assert "Traceback" not in result.stderr + result.stdout


def test_cli_db_start_reports_the_missing_server_in_process(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setattr(embedded, "SERVER_EXECUTABLE", "secantusd-py-not-installed")

    assert cli.main(["db", "start"]) == 2

    captured = capsys.readouterr()
    assert "pip install" in captured.err
    assert captured.out == ""


# --- a database zombie-pipeline did not write ----------------------------------------------------------------


@pytest.fixture
def own_client(mongo_url):
    """A client of the test's own: the CLI closes the process's shared clients when it exits."""
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_url, tz_aware=True, tzinfo=dt.UTC)
    yield client
    client.close()


def foreign_databases(fresh_database, client: MongoClient) -> tuple[Database, Database]:
    """A deployment of today's queue and cache: a zombie among its jobs, its lock, a past job, a cache entry, the
    deployment's cache index, and a sentinel in each database."""
    queue, cache = (client[fresh_database(prefix).name] for prefix in ("foreign_queue", "foreign_cache"))
    long_ago = utc_now() - dt.timedelta(hours=2)
    zombie = job_document("/splits", "acme/production", started_at=long_ago, last_heartbeat=long_ago)
    queue[DEFAULT_JOBS_COLLECTION].insert_one(zombie)
    queue["sentinel"].insert_one({ID: "sentinel", "note": "a real deployment's document"})
    queue[LOCKS_COLLECTION].insert_one({ID: zombie[Job.UNICITY_ID], Lock.OWNER: None, Lock.UPDATED_AT: long_ago})
    queue[PAST_JOBS_COLLECTION].insert_one(
        {ID: "a past job", PastJob.DATASET: "acme/other", PastJob.DURATION: 42, PastJob.FINISHED_AT: long_ago}
    )
    cache[DEFAULT_CACHE_COLLECTION].insert_one(cache_document(zombie, updated_at=long_ago - dt.timedelta(days=1)))
    cache[DEFAULT_CACHE_COLLECTION].create_index(
        [(Cache.KIND, pymongo.ASCENDING), (Cache.UPDATED_AT, pymongo.ASCENDING), (Cache.DATASET, pymongo.ASCENDING)],
        name="kind_updated",
    )
    cache["sentinel"].insert_one({ID: "sentinel", "note": "a real cache's document"})
    return queue, cache


def contents(*databases: Database) -> dict[str, Any]:
    """Every collection of the databases, its documents and its indexes: equal before and after means untouched."""
    return {
        f"{database.name}.{name}": (
            sorted(database[name].find(), key=lambda document: str(document[ID])),
            sorted((index, info["key"]) for index, info in database[name].index_information().items()),
        )
        for database in databases
        for name in sorted(database.list_collection_names())
    }


def point_at(monkeypatch, mongo_url: str, queue: Database, cache: Database, home: Path) -> None:
    for variable, value in (
        (QUEUE_URL_ENV, mongo_url),
        (CACHE_URL_ENV, mongo_url),
        (QUEUE_DATABASE_ENV, queue.name),
        (CACHE_DATABASE_ENV, cache.name),
        (HOME_ENV, str(home)),  # the demo's report files, not the project's
    ):
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv(DAGSTER_HOME_ENV, raising=False)


def test_a_sentinel_in_a_foreign_database_survives_every_command_run_with_its_url(
    mongo_url, fresh_database, own_client, tmp_path, monkeypatch, capsys
):
    queue, cache = foreign_databases(fresh_database, own_client)
    point_at(monkeypatch, mongo_url, queue, cache, tmp_path / "home")
    before = contents(queue, cache)
    databases = set(queue.client.list_database_names())

    refused = {
        "simulate": ["simulate", "--finished", "10"],
        "simulate --drop": ["simulate", "--drop", "--finished", "10"],
        # naming one database gives up that one only: the other, still foreign, stops the command before any drop
        "simulate --drop --overwrite-database <queue>": ["simulate", "--drop", "--overwrite-database", queue.name],
        "workers": ["workers", "--duration", "1"],
    }
    for name, args in refused.items():
        assert cli.main(args) == 2, name
        error = capsys.readouterr().err
        assert error.startswith("zombie-pipeline: ") and error.count("\n") == 1, (name, error)
        assert "did not write" in error or "holds no simulated queue" in error, (name, error)
        assert contents(queue, cache) == before, name

    assert cli.main(["demo"]) == 0
    printed = capsys.readouterr().out
    assert "simulates nothing and writes nothing" in printed
    assert "kill_zombies_job: succeeded" in printed and "dry run: 1 zombie found and left alone" in printed
    assert "duration_statistics and repeat_offenders of the 7 days" in printed  # read, computed, not recorded
    assert contents(queue, cache) == before
    assert set(queue.client.list_database_names()) == databases


def test_the_refusal_names_the_database_and_the_option_that_gives_it_up(
    mongo_url, fresh_database, own_client, tmp_path, monkeypatch, capsys
):
    queue, cache = foreign_databases(fresh_database, own_client)
    point_at(monkeypatch, mongo_url, queue, cache, tmp_path / "home")

    assert cli.main(["simulate"]) == 2

    error = capsys.readouterr().err
    assert f"database {queue.name!r} holds documents zombie-pipeline did not write" in error
    assert "jobsBlue (1)" in error and "sentinel (1)" in error
    assert f"--overwrite-database {queue.name}" in error


def test_simulating_twice_refuses_the_second_cleanly_and_drop_replaces_it(
    mongo_url, fresh_database, own_client, tmp_path, monkeypatch, capsys
):
    queue, cache = (own_client[fresh_database(prefix).name] for prefix in ("sim_queue", "sim_cache"))
    point_at(monkeypatch, mongo_url, queue, cache, tmp_path / "home")
    assert cli.main(["simulate", "--finished", "30"]) == 0
    capsys.readouterr()
    before = contents(queue, cache)

    assert cli.main(["simulate", "--finished", "30"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "already hold a simulated queue; --drop replaces it" in error
    assert contents(queue, cache) == before  # nothing half written
    assert cli.main(["simulate", "--drop", "--finished", "30"]) == 0


# --- a database that stops answering: nothing dropped before a write went through, each wait named -----------------


@pytest.fixture
def proxy(mongo_url):
    """A proxy to the session's server that the test stalls at a chosen command (tests/faults/proxy.py)."""
    port = pymongo.uri_parser.parse_uri(mongo_url)["nodelist"][0][1]
    with FaultProxy(port) as proxy:
        yield proxy
        proxy.reset()  # what it held is lost, never delivered late


def stalled_at(proxy: FaultProxy, trigger: Trigger) -> None:
    proxy.on(trigger, proxy.stall)


def test_simulate_drop_makes_sure_the_server_takes_a_write_before_it_drops_anything(
    mongo_url, proxy, fresh_database, own_client, tmp_path, monkeypatch, capsys
):
    queue, cache = (own_client[fresh_database(prefix).name] for prefix in ("probe_queue", "probe_cache"))
    point_at(monkeypatch, mongo_url, queue, cache, tmp_path / "home")
    assert cli.main(["simulate", "--finished", "30", "--past-days", "1"]) == 0
    before = contents(queue, cache)
    capsys.readouterr()
    monkeypatch.setenv(QUEUE_URL_ENV, proxy.url())
    monkeypatch.setenv(CACHE_URL_ENV, proxy.url())
    monkeypatch.setenv(MONGO_TIMEOUT_ENV, "1500")
    stalled_at(proxy, Trigger(WRITES))  # the server reads, but no write of ours reaches it

    assert cli.main(["simulate", "--drop", "--finished", "30"]) == 2

    error = capsys.readouterr().err
    assert error.startswith(f"zombie-pipeline: simulate: checking that {queue.name} takes writes: ")
    assert "did not answer within 1.5 s" in error and f"${MONGO_TIMEOUT_ENV} bounds every wait" in error, error
    assert error.rstrip().endswith("zombie-pipeline simulate --drop starts again") and error.count("\n") == 1
    assert contents(queue, cache) == before  # nothing dropped, nothing written
    assert [command.name for command in proxy.commands if command.name in ("delete", "dropDatabase")] == []


def test_a_simulation_cut_short_by_a_timeout_names_what_it_was_writing_and_simulate_drop_starts_again(
    mongo_url, proxy, fresh_database, own_client, tmp_path, monkeypatch, capsys
):
    queue, cache = (own_client[fresh_database(prefix).name] for prefix in ("cut_queue", "cut_cache"))
    point_at(monkeypatch, mongo_url, queue, cache, tmp_path / "home")
    for variable in (QUEUE_URL_ENV, CACHE_URL_ENV):
        monkeypatch.setenv(variable, proxy.url())
    monkeypatch.setenv(MONGO_TIMEOUT_ENV, "1500")
    stalled_at(proxy, Trigger("insert", DEFAULT_CACHE_COLLECTION))

    assert cli.main(["simulate", "--finished", "30", "--past-days", "0"]) == 2

    error = capsys.readouterr().err
    assert re.match(r"zombie-pipeline: simulate: writing \d+ cache entries: MongoDB at ", error), error
    assert f"${MONGO_TIMEOUT_ENV} bounds every wait on the database (1500 ms)" in error
    assert (
        "what the databases hold stays marked as the simulator's: zombie-pipeline simulate --drop starts again" in error
    )
    proxy.reset()
    proxy.clear()
    proxy.resume()

    assert cli.main(["simulate", "--drop", "--finished", "30", "--past-days", "0"]) == 0

    assert queue[DEFAULT_JOBS_COLLECTION].count_documents({}) > 0 and cache[DEFAULT_CACHE_COLLECTION].count_documents(
        {}
    )


# --- zombie-pipeline workers: one process per queue, stopped within seconds ------------------------------------------

#: SIGINT to exit, the jobs held finished: some 2 to 5 s on two cores, most of it the interpreter's own exit.
STOP_WITHIN_SECONDS = 20


def read_lines(stream, into: list[str]) -> threading.Thread:
    """Collect the lines of a process's output as they come (a thread of its own)."""

    def collect() -> None:
        for line in stream:
            into.append(line)

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    return thread


def test_the_workers_refuse_a_second_process_on_their_queue_and_stop_on_sigint_within_seconds_finishing_their_jobs(
    mongo_url, fresh_database, own_client, tmp_path
):
    queue, cache = (own_client[fresh_database(prefix).name] for prefix in ("workers_queue", "workers_cache"))
    store = Store.of(queue, cache)
    store.ensure_indexes()
    simulation = simulate(
        store, Workload(finished=0, crashed=2, never_heartbeated=0, terminated=0, overdue=0, running=30, waiting=10)
    )
    env = child_env(
        tmp_path / "home",
        **{QUEUE_URL_ENV: mongo_url, CACHE_URL_ENV: mongo_url, QUEUE_DATABASE_ENV: queue.name},
        **{CACHE_DATABASE_ENV: cache.name},
    )
    quiet = ["--crashes-per-worker-hour", "0", "--overruns-per-worker-hour", "0", "--heartbeat-seconds", "1"]
    # SIGINT ignored from the start, as a shell script's background job (`zombie-pipeline workers &`) has it
    first = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *CLI, "workers", *quiet],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[str] = []
    reading = read_lines(first.stdout, out)
    try:
        deadline = time.monotonic() + 120
        while not out and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert out and "30 running jobs adopted" in out[0], (out, first.poll())

        second = subprocess.run(
            [*CLI, "workers", "--duration", "1"], env=env, capture_output=True, text=True, timeout=120
        )

        time.sleep(2)  # the first one beats and moves the queue meanwhile
        signalled = time.monotonic()
        first.send_signal(signal.SIGINT)
        first.wait(timeout=120)
        took = time.monotonic() - signalled
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        reading.join(timeout=10)

    assert second.returncode == 2 and second.stdout == "", second
    assert (
        second.stderr.startswith(f"zombie-pipeline: simulated workers already run on this queue (pid {first.pid} on ")
        and second.stderr.count("\n") == 1
    ), second.stderr
    assert "stop them first (Ctrl-C where they run)" in second.stderr and "Traceback" not in second.stderr
    assert first.returncode == 0 and took < STOP_WITHIN_SECONDS, (first.returncode, took, found(first.stderr).read())
    held = next(
        re.fullmatch(r"stopping: finishing the (\d+) jobs the workers hold\n", line)
        for line in out
        if "stopping" in line
    )
    assert int(found(held).group(1)) >= 30
    started = {job[ID] for job in queue[DEFAULT_JOBS_COLLECTION].find({Job.STATUS: Status.STARTED}, {ID: 1})}
    assert started == set(simulation.zombie_ids)  # every job a worker held was finished: no false zombie left
    assert queue[SIMULATED_WORKERS_COLLECTION].count_documents({}) == 0  # its claim released: the next one may run


# --- errors a person reads ---------------------------------------------------------------------------------------

PASSWORD = "Sup3r-s3cret-Pw"


def test_error_outputs_are_one_line_naming_the_problem_with_no_traceback_nor_credential(
    mongo_url, fresh_database, own_client, tmp_path
):
    queue, cache = foreign_databases(fresh_database, own_client)
    closed = f"mongodb://operator:{PASSWORD}@127.0.0.1:{free_port()}/?directConnection=true"
    foreign = {
        QUEUE_URL_ENV: mongo_url,
        CACHE_URL_ENV: mongo_url,
        QUEUE_DATABASE_ENV: queue.name,
        CACHE_DATABASE_ENV: cache.name,
    }
    cases = {  # name: (arguments, environment, what the line must say)
        "bad option value": (["simulate", "--jobs", "-5"], {}, "--jobs must be a non-negative integer, got -5"),
        "bad worker rate": (
            ["workers", "--crashes-per-worker-hour", "-2"],
            {},
            "--crashes-per-worker-hour must be zero or more, got -2",
        ),
        "unreachable URL with a password": (
            ["simulate"],
            {QUEUE_URL_ENV: closed, CACHE_URL_ENV: closed, MONGO_TIMEOUT_ENV: "500"},
            "cannot reach MongoDB at mongodb://***:***@127.0.0.1:",
        ),
        "bad timeout setting": (
            ["demo"],
            {MONGO_TIMEOUT_ENV: "soon"},
            f"{MONGO_TIMEOUT_ENV}='soon' is not",
        ),
        "foreign database": (["simulate", "--drop"], foreign, "holds documents zombie-pipeline did not write"),
    }
    started = {
        name: subprocess.Popen(
            [*CLI, *args],
            env=child_env(tmp_path / "home", **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (args, env, _) in cases.items()
    }
    outputs = {name: process.communicate(timeout=120) for name, process in started.items()}

    for name, (_, _, expected) in cases.items():
        out, err = outputs[name]
        assert started[name].returncode == 2, (name, out, err)
        assert "Traceback" not in out + err and PASSWORD not in out + err, (name, out, err)
        assert err.startswith("zombie-pipeline: ") and err.count("\n") == 1 and expected in err, (name, err)
    assert "(from $QUEUE_MONGO_URL) within 0.5 s" in outputs["unreachable URL with a password"][1]


# --- refusals name the options as typed, and hint only at what exists ------------------------------------------------

#: (arguments, what the one line must say): each refused before anything is read or written.
REFUSED_OPTIONS = [
    (["simulate", "--crashed-fraction", "1.5"], "--crashed-fraction applies to --jobs only"),
    (["simulate", "--jobs", "100", "--crashed-fraction", "1.5"], "--crashed-fraction must be in [0, 1], got 1.5"),
    (["simulate", "--jobs", "100", "--finished", "10", "--running", "3"], "--finished, --running would have no effect"),
    (["simulate", "--generation", "2023-01", "--terminated", "2"], "--terminated has no effect on a 2023-01 queue"),
    (["simulate", "--finished", "-3"], "--finished must be a non-negative integer, got -3"),
    (["simulate", "--never-heartbeated", "-1"], "--never-heartbeated must be a non-negative integer, got -1"),
    (["simulate", "--past-days", "-1"], "--past-days must be a non-negative integer, got -1"),
    (["simulate", "--days", "0"], "--days must be positive, got 0\n"),  # as typed, not 0.0
    (["simulate", "--days", "-3"], "--days must be positive, got -3\n"),
    (["workers", "--workers", "0"], "--workers must be a positive integer, got 0"),
    (["workers", "--speed", "0"], "--speed must be positive, got 0\n"),
    (
        ["workers", "--speed", "0.5e-1", "--heartbeat-seconds", "-1.5"],
        "--heartbeat-seconds must be positive, got -1.5\n",
    ),
    (["workers", "--restart-seconds", "-5"], "--restart-seconds must be zero or more, got -5\n"),
    (["workers", "--duration", "-3"], "--duration must be positive, got -3\n"),
    (["workers", "--waiting-target", "-1"], "--waiting-target must be a non-negative integer, got -1"),
]


def options_of(command: str) -> set[str]:
    """The options ``zombie-pipeline COMMAND`` accepts."""
    parser = cli.build_parser().parse_args([command] + (["status"] if command == "db" else [])).command_parser
    return {option for action in parser._actions for option in action.option_strings}


def assert_hints_exist(line: str, command: str) -> None:
    """Every option the line names is one the command it goes with accepts: ``zombie-pipeline X --opt`` X's, else
    the refused command's."""
    for named, options in re.findall(r"zombie-pipeline (\w+)((?: --[\w-]+(?: [\w./$-]+)?)*)", line):
        for option in re.findall(r"--[\w-]+", options):
            assert option in options_of(named), (line, named, option)
    bare = re.sub(r"zombie-pipeline \w+(?: --[\w-]+(?: [\w./$-]+)?)*", "", line)
    for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", bare):
        assert option in options_of(command), (line, command, option)


@pytest.mark.parametrize(("args", "expected"), REFUSED_OPTIONS, ids=[" ".join(args) for args, _ in REFUSED_OPTIONS])
def test_a_refused_option_is_named_as_typed_in_one_line_before_anything_is_done(
    args, expected, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))  # no server is started: nothing gets that far

    assert cli.main(args) == 2

    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("zombie-pipeline: ") and captured.err.count("\n") == 1
    assert expected in captured.err, captured.err
    fields = {action.dest for action in cli.build_parser().parse_args(args).command_parser._actions}
    assert not [field for field in fields if "_" in field and field in captured.err]  # the option, not the field
    assert_hints_exist(captured.err, args[0])
    assert not (tmp_path / "home" / "server.json").exists()


#: (arguments, what the one line must say): command lines argparse cannot read.
UNREADABLE = [
    (
        ["simulate", "--jobs", "many"],
        "argument --jobs: invalid int value: 'many' (see zombie-pipeline simulate --help)",
    ),
    ([], "the following arguments are required: command (see zombie-pipeline --help)"),
    (["simulte"], "argument command: invalid choice: 'simulte'"),
    (["db"], "the following arguments are required: action (see zombie-pipeline db --help)"),
    (["workers", "--speed"], "argument --speed: expected one argument (see zombie-pipeline workers --help)"),
    (["demo", "--fast"], "unrecognized arguments: --fast (see zombie-pipeline demo --help)"),
]


@pytest.mark.parametrize(("args", "expected"), UNREADABLE, ids=[" ".join(args) or "nothing" for args, _ in UNREADABLE])
def test_a_command_line_that_cannot_be_read_is_one_line_with_where_the_options_are_not_the_usage(
    args, expected, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))

    assert cli.main(args) == 2

    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("zombie-pipeline: ") and captured.err.count("\n") == 1
    assert expected in captured.err and "usage:" not in captured.err, captured.err
    hint = re.search(r"\(see zombie-pipeline( \w+)? --help\)$", captured.err.strip())
    assert hint and (hint.group(1) is None or hint.group(1).strip() in ("simulate", "workers", "db", "demo"))


def test_a_demo_option_that_a_url_makes_pointless_is_refused_naming_it(mongo_url, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(QUEUE_URL_ENV, mongo_url)
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))

    assert cli.main(["demo", "--finished", "10", "--fresh"]) == 2

    error = capsys.readouterr().err
    assert "a MongoDB URL is set (QUEUE_MONGO_URL or CACHE_MONGO_URL)" in error and "--finished, --fresh" in error
    assert_hints_exist(error, "demo")


def test_a_malformed_url_is_refused_naming_its_variable_and_not_its_value(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv(QUEUE_URL_ENV, "mongodb//operator:Sup3r-s3cret@db.example")

    assert cli.main(["simulate"]) == 2

    error = capsys.readouterr().err
    assert error.startswith(f"zombie-pipeline: {QUEUE_URL_ENV} is not a MongoDB URL: ") and error.count("\n") == 1
    assert "Sup3r-s3cret" not in error and "operator" not in error


def test_the_demo_refusing_a_database_it_did_not_write_hints_only_at_what_exists(tmp_path, monkeypatch, capsys):
    """On the embedded server, a database loaded by hand: the demo never writes to it, and says how to go on."""
    home = tmp_path / "home"
    for variable in (QUEUE_URL_ENV, CACHE_URL_ENV, DAGSTER_HOME_ENV):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(HOME_ENV, str(home))
    try:
        client: MongoClient[dict[str, Any]] = MongoClient(embedded.ensure_server().url)
        client["datasets_server_queue"]["sentinel"].insert_one({ID: "a document of its own"})
        client.close()

        assert cli.main(["demo"]) == 2

        error = capsys.readouterr().err
        assert "database 'datasets_server_queue' holds documents zombie-pipeline did not write: sentinel (1)" in error
        assert "QUEUE_MONGO_DATABASE" in error
        assert "zombie-pipeline simulate --drop --overwrite-database datasets_server_queue" in error
        assert_hints_exist(error, "demo")
    finally:
        kill_recorded_server(home)
