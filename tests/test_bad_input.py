"""Bad input: malformed jobs are skipped and reported, bad settings are refused before any I/O,
and crafted names are only ever values in queries.

Runs on the session server (conftest ``mongo_url``), each test in fresh databases.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import dagster as dg
import pytest
from bson import ObjectId
from pymongo import MongoClient, monitoring

from figures import report_figures
from zombie_pipeline.cleanup import run_cleanup
from zombie_pipeline.detection import stale_filter
from zombie_pipeline.documents import CACHE_KEY, ID, Cache, Event, EventState, Job, Status, cache_key_of_job
from zombie_pipeline.orchestration.jobs import kill_zombies_job
from zombie_pipeline.orchestration.partitions import JOB_TYPE_PARTITIONS
from zombie_pipeline.orchestration.resources import CacheDatabase, QueueDatabase, ZombiePolicyResource
from zombie_pipeline.policy import PolicyError, ZombiePolicy
from zombie_pipeline.simulate import cache_document, job_document, utc_now
from zombie_pipeline.store import Store

URL_ENV = "ZOMBIE_TEST_BAD_INPUT_URL"
REPO = Path(__file__).resolve().parent.parent


def ago(seconds: float) -> dt.datetime:
    return utc_now() - dt.timedelta(seconds=seconds)


def zombie(dataset: str, job_type: str = "/splits", **fields: Any) -> dict[str, Any]:
    """A started job whose worker stopped beating 15 minutes ago (default policy: a zombie)."""
    return job_document(job_type=job_type, dataset=dataset, started_at=ago(1000), last_heartbeat=ago(900), **fields)


def healthy(dataset: str, job_type: str = "/splits", **fields: Any) -> dict[str, Any]:
    return job_document(job_type=job_type, dataset=dataset, started_at=ago(1000), last_heartbeat=ago(10), **fields)


def documents(store: Store) -> dict[str, list]:
    return {
        collection.full_name: sorted(collection.find(), key=lambda doc: str(doc[ID]))
        for collection in (store.jobs, store.cache, store.events)
    }


@pytest.fixture
def resources(store: Store, mongo_url: str, monkeypatch) -> dict[str, Any]:
    monkeypatch.setenv(URL_ENV, mongo_url)
    return make_resources(store)


def make_resources(store: Store, timeout_ms: int = 10_000, **policy: Any) -> dict[str, Any]:
    return {
        "queue_db": QueueDatabase(url_env_var=URL_ENV, database=store.jobs.database.name, server_selection_timeout_ms=timeout_ms),
        "cache_db": CacheDatabase(url_env_var=URL_ENV, database=store.cache.database.name, server_selection_timeout_ms=timeout_ms),
        "zombie_policy": ZombiePolicyResource(**policy),
    }


def run_job(resources: dict[str, Any], partition_key: str | None = None, **config: Any) -> tuple[dg.ExecuteInProcessResult, list]:
    """Run kill_zombies_job in process; return the result and every log record of the run."""
    run_config = {"ops": {"reconcile": {"config": config}}, "loggers": {"console": {"config": {"log_level": "ERROR"}}}}
    with dg.DagsterInstance.ephemeral() as instance:  # in memory: 0.1 s instead of 1.8 s for a temporary sqlite one
        if partition_key is not None:
            instance.add_dynamic_partitions(JOB_TYPE_PARTITIONS.name, [partition_key])
        result = kill_zombies_job.execute_in_process(
            run_config=run_config, resources=resources, instance=instance, partition_key=partition_key, raise_on_error=False
        )
        return result, list(instance.all_logs(result.run_id))


def metadata_of(result: dg.ExecuteInProcessResult, step: str) -> dict[str, Any]:
    [event] = [e for e in result.events_for_node(step) if e.event_type_value == "STEP_OUTPUT"]
    return {key: value.value for key, value in event.step_output_data.metadata.items()}


def failure_message(result: dg.ExecuteInProcessResult) -> str:
    """Every error message the run's events carry (step failures, resource init failures, run failure)."""
    messages = []
    for event in result.all_events:
        error = getattr(event.event_specific_data, "error", None)
        if error is not None:
            messages.append(error.message)
            messages.extend(cause.message for cause in _causes(error))
    return "\n".join(messages)


def _causes(error) -> list:
    found = []
    while getattr(error, "cause", None) is not None:
        error = error.cause
        found.append(error)
    return found




# --- malformed job documents ------------------------------------------------------------------------

LONG = "/" + "x" * 600


def malformed_jobs() -> dict[str, dict[str, Any]]:
    """Started jobs that would be zombies if they were well formed; each must be left alone."""
    base = lambda dataset, **fields: zombie(dataset, **fields)  # noqa: E731
    cases = {
        "missing type": base("u/no-type"),
        "missing dataset": base("u/no-dataset"),
        "missing unicity_id": base("u/no-unicity"),
        "missing started_at": base("u/no-start"),
        "null started_at": base("u/null-start"),
        "started_at as a string": base("u/start-string"),
        "started_at as a number": base("u/start-number"),
        "last_heartbeat as a string": base("u/beat-string"),
        "last_heartbeat as a number": base("u/beat-number"),
        "empty type": base("u/empty-type", job_type=""),
        "very long type": base("u/long-type", job_type=LONG),
        "empty dataset": base("", job_type="/splits"),
        "very long dataset": base("u/" + "d" * 600),
        "type starting with $": base("u/dollar-type", job_type="$where"),
        "dataset starting with $": base("$gt"),
        "unicity_id starting with $": base("u/dollar-unicity"),
        "type containing a dot": base("u/dotted-type", job_type="/first.rows"),
        "type not a string": base("u/type-number"),
        "dataset not a string": base("u/dataset-object"),
        "config not a string": base("u/config-number"),
        "config an operator object": base("u/config-object"),
        "split a list": base("u/split-list"),
        "split a boolean": base("u/split-bool"),
    }
    del cases["missing type"][Job.TYPE]
    del cases["missing dataset"][Job.DATASET]
    del cases["missing unicity_id"][Job.UNICITY_ID]
    del cases["missing started_at"][Job.STARTED_AT]
    cases["null started_at"][Job.STARTED_AT] = None
    cases["started_at as a string"][Job.STARTED_AT] = ago(1000).isoformat()
    cases["started_at as a number"][Job.STARTED_AT] = ago(1000).timestamp()
    cases["last_heartbeat as a string"][Job.LAST_HEARTBEAT] = ago(900).isoformat()
    cases["last_heartbeat as a number"][Job.LAST_HEARTBEAT] = int(ago(900).timestamp() * 1000)
    cases["unicity_id starting with $"][Job.UNICITY_ID] = "$Job"
    cases["type not a string"][Job.TYPE] = 42
    cases["dataset not a string"][Job.DATASET] = {"name": "u/dataset-object"}
    cases["config not a string"][Job.CONFIG] = 3
    cases["config an operator object"][Job.CONFIG] = {"$gt": ""}
    cases["split a list"][Job.SPLIT] = ["train"]
    cases["split a boolean"][Job.SPLIT] = True
    return cases


UNKNOWN_STATUSES = {
    "unknown status 'running'": "running",
    "unknown status 'STARTED'": "STARTED",
    "status a number": 1,
    "status missing": None,
}


def unknown_status_jobs() -> dict[str, dict[str, Any]]:
    cases = {}
    for name, status in UNKNOWN_STATUSES.items():
        job = zombie(f"u/status-{len(cases)}")
        if status is None:
            del job[Job.STATUS]
        else:
            job[Job.STATUS] = status
        cases[name] = job
    return cases


def good_jobs() -> list[dict[str, Any]]:
    """Well-formed zombies (including names that are legal on the Hub) and a healthy job."""
    return [
        zombie("u/good-1"),
        zombie("u/good-2", job_type="/first-rows", config="default", split="train"),
        zombie("u/dotted.dataset-name", job_type="/config-names"),  # dots are legal in Hub names
        zombie("u/odd", job_type="/split-names-from-streaming", config="en.wiki", split="$train"),
        healthy("u/alive"),
    ]


def test_malformed_jobs_are_skipped_and_reported_with_their_ids_and_the_rest_is_processed(store: Store, resources):
    malformed = malformed_jobs()
    good = good_jobs()
    store.jobs.insert_many(list(malformed.values()) + good)
    before = {job[ID]: job for job in store.jobs.find({ID: {"$in": [j[ID] for j in malformed.values()]}})}

    result, _ = run_job(resources, override_brake=True)

    assert result.success
    metadata = metadata_of(result, "find_zombies")
    reported = {ObjectId(item["id"]): item["problem"] for item in metadata["malformed_jobs"]}
    ids = {job[ID]: name for name, job in malformed.items()}
    assert set(reported) == set(ids), {ids[i] for i in set(ids) - set(reported)}
    assert metadata["malformed_skipped"] == len(malformed)
    for job_id, problem in reported.items():
        assert problem, ids[job_id]
    # not one byte of them changed, no event, no cache entry
    assert {job[ID]: job for job in store.jobs.find({ID: {"$in": list(before)}})} == before
    assert store.events.count_documents({ID: {"$in": list(before)}}) == 0
    assert store.cache.count_documents({Cache.DATASET: {"$in": ["u/no-type", "u/null-start", "$gt", "u/config-object"]}}) == 0
    # the rest of the queue: every good zombie finalized, the healthy job untouched
    statuses = {job[Job.DATASET]: job[Job.STATUS] for job in store.jobs.find({ID: {"$in": [j[ID] for j in good]}})}
    assert statuses == {
        "u/good-1": Status.ERROR,
        "u/good-2": Status.ERROR,
        "u/dotted.dataset-name": Status.ERROR,
        "u/odd": Status.ERROR,
        "u/alive": Status.STARTED,
    }
    assert metadata_of(result, "summarize")["finalized"] == 4
    for job in good[:4]:
        entry = store.cache.find_one(cache_key_of_job(job))
        assert entry is not None and entry[Cache.ERROR_CODE] == "JobManagerCrashedError"
    report_figures(
        "malformed_jobs",
        {
            "malformed_kinds": len(malformed),
            "malformed_skipped_in_metadata": metadata["malformed_skipped"],
            "malformed_ids_reported": len(reported),
            "malformed_documents_changed": 0,
            "events_for_malformed": 0,
            "good_zombies_finalized": metadata_of(result, "summarize")["finalized"],
            "healthy_left_started": 1,
        },
    )


def test_reported_problems_name_the_field(store: Store, resources):
    malformed = malformed_jobs()
    store.jobs.insert_many(list(malformed.values()))
    result, _ = run_job(resources, override_brake=True, dry_run=True)
    reported = {ObjectId(item["id"]): item["problem"] for item in metadata_of(result, "find_zombies")["malformed_jobs"]}
    expected_field = {
        "missing type": "type", "missing dataset": "dataset", "missing unicity_id": "unicity_id",
        "missing started_at": "started_at", "null started_at": "started_at", "started_at as a string": "started_at",
        "started_at as a number": "started_at", "last_heartbeat as a string": "last_heartbeat",
        "last_heartbeat as a number": "last_heartbeat", "empty type": "type", "very long type": "type",
        "empty dataset": "dataset", "very long dataset": "dataset", "type starting with $": "type",
        "dataset starting with $": "dataset", "unicity_id starting with $": "unicity_id",
        "type containing a dot": "type", "type not a string": "type", "dataset not a string": "dataset",
        "config not a string": "config", "config an operator object": "config", "split a list": "split",
        "split a boolean": "split",
    }
    for name, job in malformed.items():
        assert reported[job[ID]].startswith(expected_field[name]), (name, reported[job[ID]])


def test_jobs_with_unknown_statuses_are_never_touched(store: Store, resources):
    odd = unknown_status_jobs()
    good = good_jobs()
    store.jobs.insert_many(list(odd.values()) + good)
    before = {job[ID]: job for job in store.jobs.find({ID: {"$in": [j[ID] for j in odd.values()]}})}
    result, _ = run_job(resources, override_brake=True)
    assert result.success
    assert {job[ID]: job for job in store.jobs.find({ID: {"$in": list(before)}})} == before
    assert store.events.count_documents({ID: {"$in": list(before)}}) == 0
    assert metadata_of(result, "summarize")["finalized"] == 4


def test_jobs_with_unknown_statuses_are_reported_in_the_run_metadata(store: Store, resources):
    odd = unknown_status_jobs()
    store.jobs.insert_many(list(odd.values()) + good_jobs())
    result, _ = run_job(resources, override_brake=True, dry_run=True)
    reported = {ObjectId(item["id"]) for item in metadata_of(result, "find_zombies").get("malformed_jobs", [])}
    assert {job[ID] for job in odd.values()} <= reported


# --- bad configuration: refused before any read or write -----------------------------------------------------


class Commands(monitoring.CommandListener):
    """Every command any client of this process sends while registered (handshakes excluded)."""

    IGNORED = {"hello", "ismaster", "isMaster", "ping", "saslStart", "saslContinue", "endSessions", "buildInfo"}

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name not in self.IGNORED:
            self.names.append(event.command_name)

    def succeeded(self, event) -> None:
        pass

    def failed(self, event) -> None:
        pass


@pytest.fixture
def commands() -> Iterator[Commands]:
    listener = Commands()
    monitoring.register(listener)
    try:
        yield listener
    finally:
        registry = getattr(monitoring, "_LISTENERS", None)
        if registry is not None and listener in registry.command_listeners:
            registry.command_listeners.remove(listener)


def opcounters(client: MongoClient) -> dict[str, int]:
    counters = client.admin.command("serverStatus").get("opcounters", {})
    return {name: counters.get(name) for name in ("insert", "query", "update", "delete", "getmore")}


BAD_POLICIES = [
    ({"heartbeat_timeout_seconds": 0}, "heartbeat_timeout_seconds"),
    ({"heartbeat_timeout_seconds": -300}, "heartbeat_timeout_seconds"),
    ({"max_duration_seconds": 0}, "max_duration_seconds"),
    ({"max_duration_seconds": -1200}, "max_duration_seconds"),
    ({"max_duration_seconds": 200}, "heartbeat_timeout_seconds"),  # T2 below the heartbeat timeout
    ({"max_duration_seconds_by_type": {"/splits": 60}}, "max_duration_seconds_by_type['/splits']"),
    ({"max_duration_seconds_by_type": {"/splits": -5}}, "max_duration_seconds_by_type['/splits']"),
    ({"max_duration_seconds_by_type": {"": 2000}}, "max_duration_seconds_by_type"),
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": -10}, "batch_size"),
    ({"crashed_retry_limit": -1}, "crashed_retry_limit"),
    ({"exceeded_retry_limit": -1}, "exceeded_retry_limit"),
    ({"claim_lease_seconds": -60}, "claim_lease_seconds"),
    ({"min_started_for_brake": -1}, "min_started_for_brake"),
    ({"max_stale_fraction": 0.0}, "max_stale_fraction"),
    ({"max_stale_fraction": 1.5}, "max_stale_fraction"),
    ({"http_status": 200}, "http_status"),
    ({"cache_generation": "1999-01"}, "cache_generation"),
]


#: the issue's cases go through a whole Dagster run; every case is checked on the core policy below
RUN_CASES = [case for case in BAD_POLICIES if next(iter(case[0])) in {
    "heartbeat_timeout_seconds", "max_duration_seconds", "max_duration_seconds_by_type", "batch_size", "crashed_retry_limit", "claim_lease_seconds"}]


def _case_id(case) -> str:
    return ",".join(f"{k}={v}" for k, v in case[0].items())


@pytest.mark.parametrize("values, field", RUN_CASES, ids=[_case_id(case) for case in RUN_CASES])
def test_a_bad_policy_is_refused_before_any_read_or_write_with_a_message_naming_the_field(
    store: Store, mongo_url: str, monkeypatch, commands: Commands, values: dict, field: str
):
    store.jobs.insert_many([zombie("u/z1"), zombie("u/z2"), healthy("u/alive")])
    before = documents(store)
    indexes = {c.name: c.index_information() for c in (store.jobs, store.cache, store.events)}
    monkeypatch.setenv(URL_ENV, mongo_url)
    # a timeout no other test uses: the run must create its own client, which the listener would see
    resources = make_resources(store, timeout_ms=4_321, **values)
    client = store.jobs.database.client
    counters = opcounters(client)
    commands.names.clear()

    result, _ = run_job(resources, override_brake=True)

    sent = list(commands.names)
    assert opcounters(client) == counters
    assert [e.step_key for e in result.all_events if e.event_type_value == "STEP_START"] == []  # no op ran
    assert sent == [], f"the refused run sent {sent}"
    assert not result.success
    message = failure_message(result)
    assert field in message, message
    assert "invalid zombie policy" in message
    assert documents(store) == before
    assert {c.name: c.index_information() for c in (store.jobs, store.cache, store.events)} == indexes
    report_figures(
        f"bad_policy:{_case_id((values, field))}",
        {"refused": True, "field_named": field, "ops_started": 0, "commands_sent": len(sent), "opcounter_delta": 0},
    )


@pytest.mark.parametrize("values, field", BAD_POLICIES, ids=[_case_id(case) for case in BAD_POLICIES])
def test_the_core_policy_names_the_field(values: dict, field: str):
    with pytest.raises(PolicyError, match=field.replace("[", r"\[").replace("]", r"\]")):
        ZombiePolicy(**values)


@pytest.mark.parametrize("timeout", [0, -1])
def test_a_non_positive_server_selection_timeout_is_refused_naming_the_field(timeout: int):
    with pytest.raises(Exception, match="server_selection_timeout_ms"):
        QueueDatabase(database="q", server_selection_timeout_ms=timeout)


def test_an_override_for_a_job_type_the_queue_does_not_know_warns(store: Store, resources, mongo_url):
    store.jobs.insert_many([zombie("u/z1"), zombie("u/z2", job_type="/first-rows")])
    resources["zombie_policy"] = ZombiePolicyResource(max_duration_seconds_by_type={"/first-rows": 3600, "/frist-rows": 3600})
    result, logs = run_job(resources, override_brake=True)
    assert result.success
    warnings = [r.user_message for r in logs if r.level >= 30 and "/frist-rows" in (r.user_message or "")]
    assert warnings, [r.user_message for r in logs if r.level >= 30]
    assert "/first-rows'" not in warnings[0].split("/frist-rows")[0][-40:]  # the known type is not named
    assert metadata_of(result, "reconcile")["unknown_override_types"] == ["/frist-rows"]
    assert metadata_of(result, "summarize")["finalized"] == 2  # a warning, not a refusal


def test_overrides_for_known_types_do_not_warn(store: Store, resources):
    store.jobs.insert_many([zombie("u/z1"), zombie("u/z2", job_type="/first-rows")])
    resources["zombie_policy"] = ZombiePolicyResource(max_duration_seconds_by_type={"/first-rows": 3600})
    result, logs = run_job(resources, override_brake=True)
    assert result.success
    assert not [r for r in logs if r.level >= 30 and "job type" in (r.user_message or "").lower()]


# --- an invalid cron ------------------------------------------------------------------------------------

schedules = pytest.importorskip("zombie_pipeline.orchestration.schedules")
HAS_CRON_ENV = hasattr(schedules, "KILL_CRON_ENV") and hasattr(schedules, "build_kill_zombies_schedule")
BAD_CRONS = ["*/10 * * *", "61 * * * *", "every ten minutes", "* * * * * * *", "*/0 * * * *"]


@pytest.mark.skipif(not HAS_CRON_ENV, reason="no cron setting in orchestration/schedules.py")
@pytest.mark.parametrize("cron", BAD_CRONS)
def test_an_invalid_cron_is_refused_with_a_message_naming_the_variable(cron: str):
    with pytest.raises(schedules.ScheduleConfigError, match=schedules.KILL_CRON_ENV):
        schedules.build_kill_zombies_schedule(cron)


@pytest.mark.skipif(not HAS_CRON_ENV, reason="no cron setting in orchestration/schedules.py")
def test_the_code_location_refuses_to_load_with_an_invalid_cron_and_touches_no_database(store: Store, mongo_url: str):
    store.jobs.insert_many([zombie("u/z1")])
    before = documents(store)
    client = store.jobs.database.client
    counters = opcounters(client)
    env = {
        **os.environ,
        schedules.KILL_CRON_ENV: "61 * * * *",
        "QUEUE_MONGO_URL": mongo_url,
        "CACHE_MONGO_URL": mongo_url,
        "QUEUE_MONGO_DATABASE": store.jobs.database.name,
        "CACHE_MONGO_DATABASE": store.cache.database.name,
        "PYTHONPATH": str(REPO),
    }
    loaded = subprocess.run(
        [sys.executable, "-c", "import zombie_pipeline.definitions"], env=env, capture_output=True, text=True, timeout=120
    )
    assert loaded.returncode != 0
    assert schedules.KILL_CRON_ENV in loaded.stderr and "61 * * * *" in loaded.stderr
    assert opcounters(client) == counters
    assert documents(store) == before


@pytest.mark.skipif(not HAS_CRON_ENV, reason="no cron setting in orchestration/schedules.py")
def test_a_valid_cron_from_the_environment_is_used():
    assert schedules.kill_zombies_cron({schedules.KILL_CRON_ENV: "*/5 * * * *"}) == "*/5 * * * *"
    assert schedules.build_kill_zombies_schedule("*/5 * * * *").cron_schedule == "*/5 * * * *"


# --- no query injection through job type or dataset names ----------------------------------------------------

#: Strings that would widen or change a query if they ever became operators or field names.
CRAFTED = ['{"$gt": ""}', '{"$ne": null}', "$where", "$ne", "$gt", "a.b", "$exists", "this.status == 'started'"]


class Recorder(monitoring.CommandListener):
    def __init__(self) -> None:
        self.commands: list[dict] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.commands.append(dict(event.command))

    def succeeded(self, event) -> None:
        pass

    def failed(self, event) -> None:
        pass


def keys_and_strings(value: Any, keys: set, strings: set) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            keys.add(key)
            keys_and_strings(item, keys, strings)
    elif isinstance(value, (list, tuple)):
        for item in value:
            keys_and_strings(item, keys, strings)
    elif isinstance(value, str):
        strings.add(value)


@pytest.fixture
def recorded(mongo_url: str, store: Store) -> Iterator[tuple[Store, Recorder]]:
    recorder = Recorder()
    client = MongoClient(mongo_url, tz_aware=True, tzinfo=dt.timezone.utc, event_listeners=[recorder])
    try:
        yield Store.of(client[store.jobs.database.name], client[store.cache.database.name]), recorder
    finally:
        client.close()


def crafted_queue(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Zombies with crafted but well-formed names, malformed crafted ones, and bystanders with fresh results."""
    crafted_zombies = [
        zombie("u/plain", job_type='{"$gt": ""}'),
        zombie("u/plain-2", job_type='{"$ne": null}'),
        zombie('{"$gt": ""}', job_type="/splits"),
        zombie("u/$where", job_type="/config-names", config="$ne", split="a.b"),
        zombie("u/a.b", job_type="/first-rows", config='{"$exists": true}', split="$gt"),
        zombie("u/js", job_type="this.status == 'started'" .replace(".", "_")),
    ]
    crafted_malformed = [zombie("u/m1", job_type="$where"), zombie("u/m2", job_type="a.b"), zombie("$ne"), zombie("$gt", job_type="$exists")]
    bystanders = [
        healthy("u/alive", job_type="/splits"),
        healthy("u/alive-2", job_type='{"$gt": ""}'),
        job_document(job_type="/splits", dataset="u/done", status=Status.SUCCESS, started_at=ago(5000), finished_at=ago(4000)),
        job_document(job_type="/splits", dataset="u/waiting", status=Status.WAITING),
        zombie("u/other-type", job_type="/parquet"),  # a zombie of another type: only the full run may touch it
    ]
    store.jobs.insert_many(crafted_zombies + crafted_malformed + bystanders)
    entries = [cache_document(job, ago(30)) for job in bystanders[:3]]  # fresh successes anyone widening would hit
    entries += [cache_document(job, ago(86_400), http_status=500, error_code="X", failed_runs=1) for job in crafted_zombies]
    store.cache.insert_many(entries)
    return {"zombies": crafted_zombies, "malformed": crafted_malformed, "bystanders": bystanders}


def test_crafted_names_select_only_their_own_literal_jobs(recorded, store: Store):
    store.ensure_indexes()
    crafted_queue(store)
    recording_store, recorder = recorded
    policy = ZombiePolicy(claim_lease_seconds=0)

    before = documents(store)
    report = run_cleanup(recording_store, policy, "run-gt", job_types=['{"$gt": ""}'], override_brake=True)
    assert report.counts["finalized"] == 1
    [finalized] = store.jobs.find({Job.STATUS: Status.ERROR})
    assert finalized[Job.TYPE] == '{"$gt": ""}' and finalized[Job.DATASET] == "u/plain"
    assert store.jobs.find_one({Job.DATASET: "u/alive-2"})[Job.STATUS] == Status.STARTED  # same type, alive

    for names in (["$ne"], ["$where"], ["a.b"], ["$gt", "$exists"], ['{"$ne": null}x']):
        snapshot = documents(store)
        report = run_cleanup(recording_store, policy, f"run-{names[0]}", job_types=names, override_brake=True)
        assert report.counts["finalized"] == 0, names
        assert documents(store) == snapshot, names
    assert before  # (the first run changed exactly one job, checked above)


def test_a_full_run_over_crafted_names_touches_exactly_the_zombies_and_never_uses_a_name_as_a_key(recorded, store: Store):
    store.ensure_indexes()
    queue = crafted_queue(store)
    recording_store, recorder = recorded
    bystander_ids = [job[ID] for job in queue["bystanders"][:4]]
    malformed_ids = [job[ID] for job in queue["malformed"]]
    bystanders_before = sorted(store.jobs.find({ID: {"$in": bystander_ids + malformed_ids}}), key=lambda d: str(d[ID]))
    fresh_entries_before = sorted(store.cache.find({Cache.UPDATED_AT: {"$gt": ago(3600)}}), key=lambda d: str(d[ID]))
    policy = ZombiePolicy(
        claim_lease_seconds=0,
        max_duration_seconds_by_type={'{"$gt": ""}': 100_000, "$where": 5_000, "a.b": 5_000, "$ne": 5_000},
    )

    report = run_cleanup(recording_store, policy, "full-run", override_brake=True)

    zombie_ids = [job[ID] for job in queue["zombies"]] + [queue["bystanders"][4][ID]]
    assert report.counts["finalized"] == len(zombie_ids)
    assert {j[ID] for j in store.jobs.find({Job.STATUS: Status.ERROR})} == set(zombie_ids)
    assert sorted(store.jobs.find({ID: {"$in": bystander_ids + malformed_ids}}), key=lambda d: str(d[ID])) == bystanders_before
    assert sorted(store.cache.find({Cache.UPDATED_AT: {"$gt": ago(3600)}, Cache.ERROR_CODE: {"$ne": "JobManagerCrashedError"}}), key=lambda d: str(d[ID])) == fresh_entries_before
    for job in queue["zombies"]:  # each error entry sits at its literal key, exactly once
        key = cache_key_of_job(job)
        matching = [e for e in store.cache.find({Cache.KIND: key[Cache.KIND]}) if all(e.get(n) == key[n] for n in CACHE_KEY)]
        assert len(matching) == 1 and matching[0][Cache.ERROR_CODE] == "JobManagerCrashedError", key
    assert store.events.count_documents({Event.STATE: EventState.DONE}) == len(zombie_ids)

    keys: set = set()
    strings: set = set()
    for command in recorder.commands:
        keys_and_strings(command, keys, strings)
    assert not {key for key in keys for name in CRAFTED if name in key and name not in ("$ne", "$gt", "$exists")}
    # "$ne", "$gt" and "$exists" are operators the code itself uses; as names they must be values
    used_as_values = {name for name in CRAFTED if name in strings}
    assert {'{"$gt": ""}', '{"$ne": null}', "$ne", "$gt", "a.b", "$where"} <= used_as_values
    allowed_keys = _allowed_keys()
    unexpected = {key for key in keys if key not in allowed_keys}
    assert not unexpected, unexpected
    report_figures(
        "query_injection",
        {
            "commands_recorded": len(recorder.commands),
            "distinct_keys_in_commands": len(keys),
            "keys_outside_our_field_and_operator_names": len(unexpected),
            "crafted_names_seen_as_values": len(used_as_values),
            "zombies_finalized": report.counts["finalized"],
            "bystanders_and_malformed_changed": 0,
        },
    )


def _allowed_keys() -> set:
    """Field names of our documents and the command and operator names the code uses."""
    from zombie_pipeline.documents import JOB_FIELDS

    fields = set(JOB_FIELDS) | {ID}
    fields |= {value for name, value in vars(Cache).items() if name.isupper()}
    fields |= {value for name, value in vars(Event).items() if name.isupper()}
    fields |= {f"{Event.JOB}.{name}" for name in JOB_FIELDS}
    # the error entry's free-form content and details, and the policy snapshot stored in each event
    fields |= {"error", "reason", "last_heartbeat", "threshold_seconds", "run_id", "job_id", "result", "type", "seconds"}
    fields |= set(ZombiePolicy.__dataclass_fields__)
    operators = {"$in", "$nin", "$lt", "$gt", "$ne", "$or", "$and", "$exists", "$not", "$type", "$set", "$natural", "$hint"}
    command_keys = {
        "find", "filter", "sort", "limit", "batchSize", "projection", "hint", "update", "updates", "q", "u", "upsert",
        "multi", "insert", "documents", "ordered", "delete", "deletes", "aggregate", "pipeline", "cursor", "$match",
        "$group", "$sort", "$count", "$project", "count", "n", "$db", "lsid", "id", "txnNumber", "$clusterTime", "clusterTime", "signature",
        "hash", "keyId", "getMore", "collection", "listIndexes", "createIndexes", "indexes", "key", "name", "unique",
        "distinct", "query", "readConcern", "writeConcern", "singleBatch", "killCursors", "cursors", "endSessions",
        "$readPreference", "mode", "comment", "maxTimeMS", "let", "skip", "$sum", "$limit", "$skip", "apiVersion",
        "bypassDocumentValidation", "collation", "arrayFilters", "ping", "listCollections", "nameOnly",
    }
    return fields | operators | command_keys


def test_the_stale_filter_keeps_crafted_names_as_values():
    policy = ZombiePolicy(max_duration_seconds_by_type={name: 5_000 for name in CRAFTED})
    query = stale_filter(policy, utc_now(), job_types=CRAFTED)
    keys: set = set()
    strings: set = set()
    keys_and_strings(query, keys, strings)
    assert keys <= {Job.STATUS, Job.STARTED_AT, Job.LAST_HEARTBEAT, Job.TYPE, "$or", "$lt", "$in", "$nin"}
    assert set(CRAFTED) <= strings


def test_a_crafted_partition_key_cleans_only_its_literal_type(store: Store, resources):
    crafted_queue(store)
    result, _ = run_job(resources, partition_key='{"$gt": ""}', override_brake=True)
    assert result.success, failure_message(result)
    assert [j[Job.DATASET] for j in store.jobs.find({Job.STATUS: Status.ERROR})] == ["u/plain"]


def test_run_config_refuses_an_operator_object_as_a_job_type(store: Store, resources):
    with pytest.raises(dg.DagsterInvalidConfigError):
        kill_zombies_job.execute_in_process(
            run_config={"ops": {"reconcile": {"config": {"job_types": [{"$gt": ""}]}}}}, resources=resources
        )
    assert store.events.count_documents({}) == 0


# --- a queue that broke its own rule: two started jobs with one unicity_id -----------------------------------


def test_two_started_zombies_with_one_unicity_id_get_a_single_retry(store: Store):
    """At most one started job per unicity_id is the queue's rule; when a race broke it, both
    zombies are finalized, but only one retry may be enqueued, whichever batch they fall in."""
    first = job_document(dataset="u/twice", started_at=ago(1100), last_heartbeat=ago(1000))
    second = job_document(dataset="u/twice", started_at=ago(1000), last_heartbeat=ago(900))
    assert first[Job.UNICITY_ID] == second[Job.UNICITY_ID]
    store.jobs.insert_many([first, second])

    report = run_cleanup(store, ZombiePolicy(claim_lease_seconds=0), "run-1", override_brake=True)

    assert report.counts["finalized"] == 2
    waiting = list(store.jobs.find({Job.UNICITY_ID: first[Job.UNICITY_ID], Job.STATUS: Status.WAITING}))
    assert len(waiting) == 1, f"{len(waiting)} retries enqueued for one unicity_id"
    outcomes = sorted(event["retry_outcome"] for event in store.events.find())
    assert outcomes == ["already_queued", "enqueued"]
