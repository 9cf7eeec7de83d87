"""Secrets: the password in QUEUE_MONGO_URL / CACHE_MONGO_URL appears in no output of any run.

A SecantusDB server with ``--auth`` and a user whose password is full of characters
that URLs, shells and log formats treat specially. The CLI (``simulate``, ``demo``),
``dagster job execute`` and kill_zombies_job in process run with the password in the
URLs, then with a wrong password, an unreachable host and an unescaped (malformed)
URL. Everything they produce is collected: stdout and stderr of every subprocess,
every file under DAGSTER_HOME (run and event log storage, compute logs), under
ZOMBIE_PIPELINE_HOME (report files) and under the working directory, every event
log record, the run metadata, and the exception messages of the core. The password
is looked for in each, raw and in every encoding a URL may carry it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import dagster as dg
import pytest
from dagster._serdes import serialize_value
from pymongo import MongoClient

from tests.figures import report_figures
from tests.helpers import (
    CACHE_GENERATION,
    QUEUE_GENERATION,
    databases_from_env,
    run_kill_zombies,
    step_failure_messages,
    workload,
)
from tests.servers import REPO_ROOT, LocalServer, running_server
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    DAGSTER_HOME_ENV,
    HOME_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
)
from zombie_pipeline.defs.resources import (
    ZombiePolicyResource,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.connections import (
    DatabaseUnavailable,
    check_reachable,
    close_clients,
)
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.secrets import redact, redact_url, scheme_and_host
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.simulator import simulate

USER = "zombie-cleaner"
#: '@', ':', '/', '?', '#', '%', '+', '&', '=', space, quotes, brackets, a backslash and non-ASCII
PASSWORD = "Zq7Kx9-s3cr3t@:/?#[]%2F+ &='\"\\é-P4ss"
WRONG_PASSWORD = "Wr0ngVv8-s3cr3t@:/?#%+ &=é-N0pe"
TOKENS = ("Zq7Kx9", "P4ss", "Wr0ngVv8", "N0pe")  # fragments no encoding changes
QUEUE = "secrets_queue"
CACHE = "secrets_cache"


def variants(password: str) -> set[str]:
    """The forms a password takes in a URL, a log or a repr."""
    forms = {password, quote_plus(password), quote(password, safe=""), quote(password), repr(password)[1:-1]}
    forms |= {password.encode("unicode_escape").decode(), password.replace("\\", "\\\\"), password.replace('"', '\\"')}
    return {form for form in forms if len(form) >= 6}


SECRETS = sorted(variants(PASSWORD) | variants(WRONG_PASSWORD) | set(TOKENS), key=len, reverse=True)


def url(port: int, password: str = PASSWORD, escaped: bool = True) -> str:
    secret = quote_plus(password) if escaped else password
    return f"mongodb://{quote_plus(USER)}:{secret}@127.0.0.1:{port}/?authSource=admin&directConnection=true"


class Outputs:
    """Everything the runs produced, by source, searched for the secrets at the end of each test."""

    def __init__(self) -> None:
        self.sources: dict[str, bytes] = {}

    def add(self, name: str, data: Any) -> None:
        if isinstance(data, bytes):
            blob = data
        elif isinstance(data, str):
            blob = data.encode("utf-8", "surrogateescape")
        else:
            blob = repr(data).encode("utf-8", "surrogateescape")
        self.sources[name] = self.sources.get(name, b"") + blob

    def add_tree(self, name: str, root: Path) -> int:
        count = 0
        for path in sorted(root.rglob("*")):
            if path.is_file() and "secantus-data" not in path.parts:
                self.add(f"{name}/{path.relative_to(root)}", path.read_bytes())
                count += 1
        return count

    def leaks(self) -> dict[str, list[str]]:
        found = {}
        for name, blob in self.sources.items():
            hits = [
                secret
                for secret in SECRETS
                if secret.encode("utf-8") in blob or secret.encode("latin-1", "ignore") in blob
            ]
            if hits:
                found[name] = hits
        return found

    def assert_clean(self, scenario: str) -> None:
        assert self.sources, "nothing was captured"
        leaks = self.leaks()
        report_figures(
            f"secrets:{scenario}",
            {
                "sources_searched": len(self.sources),
                "files_searched": sum(1 for name in self.sources if "/" in name.split(":")[0]),
                "bytes_searched": sum(len(blob) for blob in self.sources.values()),
                "password_forms_searched": len(SECRETS),
                "leaks": len(leaks),
            },
        )
        assert leaks == {}


# --- the server ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """SecantusDB with authentication on, and one user whose password is :data:`PASSWORD`."""
    with running_server(tmp_path_factory.mktemp("auth-server"), users={USER: PASSWORD}) as server:
        yield server


@pytest.fixture
def outputs() -> Outputs:
    return Outputs()


def env_for(queue_url: str, homes: dict[str, Path], cache_url: str | None = None, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in (QUEUE_URL_ENV, CACHE_URL_ENV) and not key.startswith("PYTEST")
    }
    env.update(
        {
            QUEUE_URL_ENV: queue_url,
            CACHE_URL_ENV: cache_url or queue_url,
            QUEUE_DATABASE_ENV: QUEUE,
            CACHE_DATABASE_ENV: CACHE,
            DAGSTER_HOME_ENV: str(homes["dagster_home"]),
            HOME_ENV: str(homes["zombie_home"]),
            "PYTHONPATH": str(REPO_ROOT),
            **extra,
        }
    )
    return env


def cli(*args: str) -> list[str]:
    executable = Path(sys.executable).parent / "zombie-pipeline"
    return [str(executable), *args] if executable.exists() else [sys.executable, "-m", "zombie_pipeline.app.cli", *args]


def dagster_cli(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "dagster"), *args]


def collect_homes(outputs: Outputs, homes: dict[str, Path]) -> int:
    return sum(outputs.add_tree(name, path) for name, path in homes.items())


# --- the module's commands, started together -------------------------------------------------------------


class Commands:
    """The CLI commands of the module, each in the homes of its scenario, started together when the module starts.

    They spend most of their time importing and waiting (one waits out a 10 s server selection
    timeout), so they run while the tests work in process; each test collects its own.
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="secrets-command")
        self.futures: dict[str, Future] = {}
        self.closed_port = free_port()  # where no server listens: the unreachable host

    def homes(self, scenario: str) -> dict[str, Path]:
        """The scenario's DAGSTER_HOME, ZOMBIE_PIPELINE_HOME and working directory; all are searched afterwards."""
        paths = {name: self.base / scenario / name for name in ("dagster_home", "zombie_home", "cwd")}
        for path in paths.values():
            path.mkdir(parents=True, exist_ok=True)
        return paths

    def start(self, name: str, args: list[str], queue_url: str, scenario: str, after: str | None = None) -> None:
        """Run ``args`` in the scenario's homes, once the command ``after`` (if any) is done."""
        homes = self.homes(scenario)
        env = env_for(queue_url, homes)
        previous = self.futures.get(after) if after else None

        def run() -> subprocess.CompletedProcess:
            if previous is not None:
                previous.result()
            return subprocess.run(args, env=env, cwd=homes["cwd"], capture_output=True, timeout=300)

        self.futures[name] = self.pool.submit(run)

    def collect(self, name: str, outputs: Outputs) -> subprocess.CompletedProcess:
        """The command's result; its stdout and stderr go to ``outputs``."""
        completed = self.futures[name].result(timeout=600)
        outputs.add(f"{name}: stdout", completed.stdout)
        outputs.add(f"{name}: stderr", completed.stderr)
        return completed

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


#: The queue the suites are written for (``tests.helpers.QUEUE_GENERATION``), as the CLI is told it.
GENERATIONS = ("--generation", QUEUE_GENERATION, "--cache-generation", CACHE_GENERATION)


@pytest.fixture(scope="module")
def commands(auth_server: LocalServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Commands]:
    started = Commands(tmp_path_factory.mktemp("secrets-commands"))
    good = url(auth_server.port)
    started.start(
        "cli simulate",
        cli(
            "simulate",
            "--drop",
            *GENERATIONS,
            "--finished",
            "200",
            "--crashed",
            "12",
            "--running",
            "20",
            "--waiting",
            "5",
        ),
        good,
        "full_run",
    )
    run_config = started.homes("full_run")["cwd"] / "run_config.yaml"
    run_config.write_text("ops:\n  plan_and_recover:\n    config:\n      override_brake: true\n")
    started.start(
        "dagster job execute",
        dagster_cli(
            "job", "execute", "-m", "zombie_pipeline.definitions", "-j", "kill_zombies_job", "-c", str(run_config)
        ),
        good,
        "full_run",
        after="cli simulate",
    )
    started.start("cli demo", cli("demo"), good, "demo", after="cli simulate")  # on the simulated queue
    started.start(
        "cli simulate, wrong password",
        cli("simulate", "--finished", "10"),
        url(auth_server.port, WRONG_PASSWORD),
        "wrong_password",
    )
    started.start(
        "cli simulate, unreachable", cli("simulate", "--finished", "10"), url(started.closed_port), "unreachable_host"
    )
    for password, scenario in ((PASSWORD, "unescaped_right"), (WRONG_PASSWORD, "unescaped_wrong")):
        started.start(
            f"cli simulate, {scenario}",
            cli("simulate", "--finished", "10"),
            url(auth_server.port, password, escaped=False),
            scenario,
        )
    try:
        yield started
    finally:
        started.close()


def in_process_run(
    queue_url: str, outputs: Outputs, name: str, monkeypatch, timeout_ms: int = 10_000, **config: Any
) -> dg.ExecuteInProcessResult:
    """kill_zombies_job in process; its every event log record, run record and metadata go to ``outputs``."""
    monkeypatch.setenv(QUEUE_URL_ENV, queue_url)
    monkeypatch.setenv(CACHE_URL_ENV, queue_url)
    resources: dict[str, Any] = {
        "databases": databases_from_env(QUEUE, CACHE, timeout_ms=timeout_ms),
        "zombie_policy": ZombiePolicyResource(),
    }
    with dg.DagsterInstance.ephemeral() as instance:
        try:  # Dagster's own console logger, as a deployment runs it
            result = run_kill_zombies(
                resources, instance=instance, run_config={"loggers": {}}, override_brake=True, **config
            )
        except Exception as error:  # noqa: BLE001 - the message itself is under test
            outputs.add(f"{name}: exception", f"{type(error).__name__}: {error}")
            raise
        for record in result.logs:
            outputs.add(f"{name}: event log", serialize_value(record))
            outputs.add(f"{name}: event log text", f"{record.user_message}\n")
        outputs.add(f"{name}: run record", serialize_value(instance.get_run_by_id(result.run_id)))
        for event in result.all_events:
            outputs.add(f"{name}: events", repr(event))
        outputs.add(f"{name}: resources describe", repr(resources["databases"].describe()))
    close_clients()
    return result


# --- the right password ---------------------------------------------------------------------------------


def test_a_full_run_with_the_password_in_the_urls_leaks_it_nowhere(
    auth_server: LocalServer, commands: Commands, outputs: Outputs, monkeypatch
):
    good = url(auth_server.port)
    homes = commands.homes("full_run")

    simulated = commands.collect("cli simulate", outputs)
    assert simulated.returncode == 0, simulated.stderr.decode()[-2000:]
    assert b"***" in simulated.stdout or b"127.0.0.1" in simulated.stdout

    executed = commands.collect("dagster job execute", outputs)
    assert executed.returncode == 0, executed.stderr.decode()[-3000:]

    client: MongoClient[dict[str, Any]] = MongoClient(good, tz_aware=True)
    finalized = client[QUEUE]["zombieEvents"].count_documents({})
    assert finalized >= 12  # the run really ran, authenticated

    simulate(
        Store.of(client[QUEUE], client[CACHE]),
        workload(finished=0, crashed=6, never_heartbeated=0, overdue=0, running=30, waiting=0, seed=99),
    )
    result = in_process_run(good, outputs, "in-process job", monkeypatch)
    assert result.success
    assert result.output_for_node("report_cleanup")["finalized"] == 6

    store = Store.of(client[QUEUE], client[CACHE])
    report = run_cleanup(store, ZombiePolicy(), "core-run", dry_run=True)
    outputs.add("core report", repr(report))
    client.close()

    files = collect_homes(outputs, homes)
    assert files > 0  # Dagster's storage at least
    outputs.assert_clean("full_run")


def test_the_demo_with_the_password_in_the_urls_leaks_it_nowhere(commands: Commands, outputs: Outputs):
    demo = commands.collect("cli demo", outputs)
    assert demo.returncode in (0, 1), demo.stderr.decode()[-2000:]
    assert b"Traceback" not in demo.stderr
    collect_homes(outputs, commands.homes("demo"))
    outputs.assert_clean("demo")


# --- wrong password, unreachable host, malformed URL ---------------------------------------------------------


def test_a_wrong_password_fails_cleanly_and_leaks_neither_password(
    auth_server: LocalServer, commands: Commands, outputs: Outputs, monkeypatch
):
    wrong = url(auth_server.port, WRONG_PASSWORD)

    result = in_process_run(wrong, outputs, "in-process job, wrong password", monkeypatch)
    assert not result.success
    # a refused password is not retried: the step fails once (a server out of reach is retried, test_failures.py)
    assert not [event for event in result.all_events if event.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert len([event for event in result.all_events if event.is_step_failure]) == 1

    client: MongoClient[dict[str, Any]] = MongoClient(wrong, serverSelectionTimeoutMS=3_000)
    with pytest.raises(DatabaseUnavailable) as unavailable:
        check_reachable(client[QUEUE], wrong)
    outputs.add("check_reachable, wrong password", str(unavailable.value))
    with pytest.raises(Exception) as failure:
        run_cleanup(Store.of(client[QUEUE], client[CACHE]), ZombiePolicy(), "core-wrong")
    outputs.add("run_cleanup exception, wrong password", f"{type(failure.value).__name__}: {failure.value}")
    client.close()

    simulated = commands.collect("cli simulate, wrong password", outputs)
    assert simulated.returncode != 0
    assert b"Traceback" not in simulated.stderr
    assert b"uthentication failed" in simulated.stderr, simulated.stderr

    collect_homes(outputs, commands.homes("wrong_password"))
    outputs.assert_clean("wrong_password")


def test_an_unreachable_host_fails_cleanly_and_leaks_no_password(commands: Commands, outputs: Outputs, monkeypatch):
    unreachable = url(commands.closed_port)

    result = in_process_run(unreachable, outputs, "in-process job, unreachable", monkeypatch, timeout_ms=1_000)
    assert not result.success
    messages = step_failure_messages(result)
    assert any("cannot reach MongoDB at mongodb://***:***@127.0.0.1" in m for m in messages), messages

    client: MongoClient[dict[str, Any]] = MongoClient(unreachable, serverSelectionTimeoutMS=1_000)
    with pytest.raises(DatabaseUnavailable) as unavailable:
        check_reachable(client[QUEUE], unreachable)
    outputs.add("check_reachable, unreachable", str(unavailable.value))
    client.close()

    simulated = commands.collect("cli simulate, unreachable", outputs)  # it waits out its 10 s server selection timeout
    assert simulated.returncode != 0
    assert b"Traceback" not in simulated.stderr
    assert b"cannot reach" in simulated.stderr or b"Timeout" in simulated.stderr, simulated.stderr

    collect_homes(outputs, commands.homes("unreachable_host"))
    outputs.assert_clean("unreachable_host")


@pytest.mark.parametrize("password", [PASSWORD, WRONG_PASSWORD], ids=["right", "wrong"])
def test_a_url_with_the_password_left_unescaped_fails_cleanly_and_leaks_nothing(
    auth_server: LocalServer, commands: Commands, outputs: Outputs, monkeypatch, password: str
):
    scenario = f"unescaped_{'right' if password == PASSWORD else 'wrong'}"
    malformed = url(auth_server.port, password, escaped=False)

    simulated = commands.collect(f"cli simulate, {scenario}", outputs)
    assert simulated.returncode != 0
    assert b"Traceback" not in simulated.stderr

    result = in_process_run(malformed, outputs, "in-process job, unescaped", monkeypatch, timeout_ms=1_000)
    assert not result.success

    outputs.add("redact_url, unescaped", redact_url(malformed))
    collect_homes(outputs, commands.homes(scenario))
    outputs.assert_clean(f"{scenario}_password")


def test_the_search_would_see_a_leak(outputs: Outputs):
    """The net has no hole: each form of the password, planted in an output, is found."""
    for form in variants(PASSWORD):
        planted = Outputs()
        planted.add("planted", f"error: could not connect with {form} as password")
        assert planted.leaks(), form
    assert redact(url(1), [url(1)]).count("***") >= 1


def test_a_webhooks_url_is_shown_by_its_scheme_and_host_only():
    """Its credentials, path and query often carry its token."""
    assert scheme_and_host("https://user:t0ken@hooks.example:8443/s3cr3t?k=v") == "https://hooks.example:8443/…"
    assert scheme_and_host("not a url") == "(not a URL)"
