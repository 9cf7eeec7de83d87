"""``zombie-pipeline status``: how the queue is doing, read on indexes, nothing written."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.helpers import documents, logged_store
from zombie_pipeline.app import cli
from zombie_pipeline.app.status import queue_status
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    HOME_ENV,
    POLICY_FILE_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, Failure, LateEvidence, LateResult, Quarantine
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.history import OFFENDER
from zombie_pipeline.simulation.simulator import Simulation, simulate
from zombie_pipeline.simulation.workload import Workload

#: Today's queue as the demo has it, with a week of daily cleanups behind it and a repeat offender quarantined.
WORKLOAD = Workload(finished=300, running=100, waiting=30, past_cleanups=7, days=8, seed=5)


@pytest.fixture
def simulated(store) -> Simulation:
    return simulate(store, WORKLOAD)


def test_the_status_says_the_started_jobs_the_zombies_the_cleanups_and_the_quarantine(store, simulated):
    now = utc_now()
    status = queue_status(store, ZombiePolicy(), now, {"queue": "q", "cache": "c"})

    started = status["started"]
    assert started["total"] == WORKLOAD.started
    assert started["waiting"] == store.jobs.count_documents({Job.STATUS: Status.WAITING})  # the past days' re-runs too
    rows = started["by_type"]
    assert sum(row["under_half_t2"] + row["past_half_t2"] + row["past_t2"] for row in rows) == WORKLOAD.started
    # the overdue jobs and no healthy one are past their T2; the dead ones and no healthy one are silent
    assert sum(row["past_t2"] for row in rows) >= WORKLOAD.overdue
    assert sum(row["silent"] for row in rows) == WORKLOAD.crashed + WORKLOAD.never_heartbeated + WORKLOAD.terminated
    zombies = status["zombies"]
    assert zombies["total"] == len(simulated.zombie_ids)
    assert zombies["by_reason"][Reason.MISSING_HEARTBEAT] == WORKLOAD.crashed
    assert not zombies["brake"]["engaged"]
    # the daily cleanups of the simulated week, the latest first, by cause
    assert simulated.past is not None
    cleanups = status["cleanups"]
    assert [run["run_id"] for run in cleanups] == list(reversed(simulated.past.run_ids))[: len(cleanups)]
    assert all(sum(run["by_cause"].values()) == run["finalized"] > 0 for run in cleanups)
    [quarantine] = status["quarantines"]
    assert (quarantine["dataset"], quarantine["type"]) == (OFFENDER[1], OFFENDER[0])


def test_the_last_day_says_how_long_the_dead_jobs_waited_and_what_showed_life_or_failed(store, simulated):
    # an hour after the latest daily cleanup: at a later hour of today it would be more than a day ago
    [latest] = store.events.find().sort(Event.FINALIZED_AT, -1).limit(1)
    now = latest[Event.FINALIZED_AT] + dt.timedelta(hours=1)
    yesterday = list(store.events.find({Event.FINALIZED_AT: {"$gte": now - dt.timedelta(days=1)}}))
    assert yesterday, "the simulated cleanup of yesterday finalized nothing"
    late = yesterday[0]
    store.events.update_one(
        {ID: late[ID]},
        {
            "$set": {
                Event.LATE_RESULT: {
                    LateResult.EVIDENCE: LateEvidence.HEARTBEAT,
                    LateResult.SEEN_AT: now - dt.timedelta(minutes=5),
                    LateResult.SECONDS_AFTER: 120.0,
                }
            }
        },
    )
    store.failures.insert_one(
        {ID: "run-1", Failure.JOB_NAME: "kill_zombies_job", Failure.FAILED_AT: now, Failure.MESSAGE: "brake engaged"}
    )

    last_day = queue_status(store, ZombiePolicy(), now, {"queue": "q", "cache": "c"})["last_day"]

    assert last_day["finalized"] == len(yesterday)
    detection = last_day["times"][Event.DETECTION_SECONDS]
    seconds = sorted(event[Event.DETECTION_SECONDS] for event in yesterday)
    assert detection["count"] == len(yesterday) and detection["max"] == round(seconds[-1])
    assert last_day["late_results"]["count"] == 1 and last_day["late_results"]["jobs"][0]["job_id"] == str(late[ID])
    assert last_day["pipeline_failures"]["count"] == 1
    assert last_day["pipeline_failures"]["last"]["message"] == "brake engaged"


def test_the_status_reads_on_indexes_whatever_the_history_holds_and_writes_nothing(mongo_url, store, fresh_database):
    """The same commands for a short history as for a long one; each filtered on an index's leading field."""
    simulate(store, WORKLOAD)
    before = documents(store)
    with logged_store(mongo_url, store) as (logged, log):
        queue_status(logged, ZombiePolicy(), utc_now(), {"queue": "q", "cache": "c"})
    short = [name for name in log.names if name != "endSessions"]  # the client's own, when it closes

    assert documents(store) == before
    assert set(short) <= {"find", "aggregate", "count", "getMore"}, short
    leading = {
        store.jobs.name: {"status"},
        store.events.name: {Event.FINALIZED_AT, Event.STATE},
        store.quarantine.name: {Quarantine.LAPSES_AT},
        store.retries.name: {"state"},
        store.failures.name: {Failure.FAILED_AT},
    }
    for name, command in zip(log.names, log.commands, strict=True):
        if name in ("getMore", "endSessions"):
            continue
        collection = command[name]
        query = command.get("filter", command.get("query")) or command["pipeline"][0]["$match"]
        assert leading[collection] & set(query), (collection, query)

    longer = Workload(**{**WORKLOAD.__dict__, "finished": 3_000, "seed": 6})
    other = type(store).of(fresh_database("queue"), fresh_database("cache"))
    simulate(other, longer)
    with logged_store(mongo_url, other) as (logged, log):
        queue_status(logged, ZombiePolicy(), utc_now(), {"queue": "q", "cache": "c"})
    assert [name for name in log.names if name not in ("getMore", "endSessions")] == [
        name for name in short if name != "getMore"
    ]


def test_the_command_prints_it_as_text_or_json_from_the_locations_policy(
    store, simulated, mongo_url, monkeypatch, tmp_path, capsys
):
    path = tmp_path / "policy.yaml"
    path.write_text("max_duration_seconds_by_type:\n  /first-rows: 2400\n")
    for variable, value in {
        QUEUE_URL_ENV: mongo_url,
        CACHE_URL_ENV: mongo_url,
        QUEUE_DATABASE_ENV: store.jobs.database.name,
        CACHE_DATABASE_ENV: store.cache.database.name,
        POLICY_FILE_ENV: str(path),
        HOME_ENV: str(tmp_path / "home"),
    }.items():
        monkeypatch.setenv(variable, value)

    assert cli.main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["policy"]["source"].startswith(f"file {path} (sha256 ")
    assert {row["type"]: row["t2_seconds"] for row in status["started"]["by_type"]}.get("/first-rows") in (None, 2400)

    assert cli.main(["status"]) == 0
    text = capsys.readouterr().out
    for line in (
        "started jobs: ",
        "zombies now: ",
        "last cleanups that finalized zombies",
        "quarantines: 1",
        "last 24 h",
    ):
        assert line in text, text
    assert f"{OFFENDER[1]} {OFFENDER[0]}: " in text and "lift_quarantine_job" in text


def test_without_a_url_and_without_the_embedded_server_it_says_there_is_nothing_to_read(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(QUEUE_URL_ENV, raising=False)
    monkeypatch.delenv(CACHE_URL_ENV, raising=False)
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))

    assert cli.main(["status"]) == 2

    assert "the embedded server is not running: nothing to read" in capsys.readouterr().err
    assert not (tmp_path / "home" / "server.json").exists()
