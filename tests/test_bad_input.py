"""Bad input: malformed jobs are skipped and reported, bad settings are refused before any I/O,
and crafted names are only ever values in queries.

Runs on the session server (conftest ``mongo_url``), each test in fresh databases.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import dagster as dg
import pytest
from bson import ObjectId

from tests.figures import report_figures
from tests.helpers import (
    HANDSHAKES,
    CommandLog,
    ago,
    database_resources,
    documents,
    error_text,
    found,
    job_document,
    level,
    logged_store,
    logging_every_client,
    opcounters,
    raw,
    run_kill_zombies,
    step_failure_messages,
    step_metadata,
)
from tests.test_policy import BAD_POLICIES, case_id
from zombie_pipeline.cleanup.detection import stale_filter
from zombie_pipeline.cleanup.run import UnknownJobTypes, run_cleanup
from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.failures.causes import result_cause
from zombie_pipeline.defs.resources import ZombiePolicyResource
from zombie_pipeline.policy import PolicyError, ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState, ScheduledRetry
from zombie_pipeline.queue.cache import CACHE_KEY, Cache, cache_key_of_job
from zombie_pipeline.queue.cache_entries import DETAIL_QUARANTINED
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status, job_type_problem
from zombie_pipeline.queue.store import Document, Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document

URL_ENV = "ZOMBIE_TEST_BAD_INPUT_URL"


def zombie(dataset: str, job_type: str = "/splits", **fields: Any) -> JobDocument:
    """A started job whose worker stopped beating 15 minutes ago (default policy: a zombie)."""
    return job_document(job_type=job_type, dataset=dataset, started_at=ago(1000), last_heartbeat=ago(900), **fields)


def healthy(dataset: str, job_type: str = "/splits", **fields: Any) -> JobDocument:
    return job_document(job_type=job_type, dataset=dataset, started_at=ago(1000), last_heartbeat=ago(10), **fields)


@pytest.fixture
def resources(store: Store, mongo_url: str, monkeypatch) -> dict[str, Any]:
    monkeypatch.setenv(URL_ENV, mongo_url)
    return make_resources(store)


def make_resources(store: Store, timeout_ms: int = 10_000, **policy: Any) -> dict[str, Any]:
    return {
        **database_resources(store, URL_ENV, timeout_ms=timeout_ms),
        "zombie_policy": ZombiePolicyResource(**policy),
    }


# --- malformed job documents ------------------------------------------------------------------------

LONG = "/" + "x" * 600


def malformed_jobs() -> dict[str, Document]:
    """Started jobs that would be zombies if they were well formed; each must be left alone."""
    base = lambda dataset, **fields: cast(Document, zombie(dataset, **fields))  # noqa: E731
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


def unknown_status_jobs() -> dict[str, Document]:
    cases: dict[str, Document] = {}
    for name, status in UNKNOWN_STATUSES.items():
        job = cast(Document, zombie(f"u/status-{len(cases)}"))
        if status is None:
            del job[Job.STATUS]
        else:
            job[Job.STATUS] = status
        cases[name] = job
    return cases


def good_jobs() -> list[JobDocument]:
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
    raw(store.jobs).insert_many([*malformed.values(), *good])
    before = {job[ID]: job for job in store.jobs.find({ID: {"$in": [j[ID] for j in malformed.values()]}})}

    result = run_kill_zombies(resources, override_brake=True)

    assert result.success
    metadata = step_metadata(result, "find_zombies")
    reported = {ObjectId(item["id"]): item["problem"] for item in metadata["malformed_jobs"]}
    ids = {job[ID]: name for name, job in malformed.items()}
    assert set(reported) == set(ids), {ids[i] for i in set(ids) - set(reported)}
    assert metadata["malformed_skipped"] == len(malformed)
    for job_id, problem in reported.items():
        assert problem, ids[job_id]
    # not one byte of them changed, no event, no cache entry
    assert {job[ID]: job for job in store.jobs.find({ID: {"$in": list(before)}})} == before
    assert store.events.count_documents({ID: {"$in": list(before)}}) == 0
    assert (
        store.cache.count_documents({Cache.DATASET: {"$in": ["u/no-type", "u/null-start", "$gt", "u/config-object"]}})
        == 0
    )
    # the rest of the queue: every good zombie finalized, the healthy job untouched
    statuses = {job[Job.DATASET]: job[Job.STATUS] for job in store.jobs.find({ID: {"$in": [j[ID] for j in good]}})}
    assert statuses == {
        "u/good-1": Status.ERROR,
        "u/good-2": Status.ERROR,
        "u/dotted.dataset-name": Status.ERROR,
        "u/odd": Status.ERROR,
        "u/alive": Status.STARTED,
    }
    assert step_metadata(result, "report_cleanup")["finalized"] == 4
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
            "good_zombies_finalized": step_metadata(result, "report_cleanup")["finalized"],
            "healthy_left_started": 1,
        },
    )


def test_reported_problems_name_the_field(store: Store, resources):
    malformed = malformed_jobs()
    raw(store.jobs).insert_many(list(malformed.values()))
    result = run_kill_zombies(resources, override_brake=True, dry_run=True)
    reported = {
        ObjectId(item["id"]): item["problem"] for item in step_metadata(result, "find_zombies")["malformed_jobs"]
    }
    expected_field = {
        "missing type": "type",
        "missing dataset": "dataset",
        "missing unicity_id": "unicity_id",
        "missing started_at": "started_at",
        "null started_at": "started_at",
        "started_at as a string": "started_at",
        "started_at as a number": "started_at",
        "last_heartbeat as a string": "last_heartbeat",
        "last_heartbeat as a number": "last_heartbeat",
        "empty type": "type",
        "very long type": "type",
        "empty dataset": "dataset",
        "very long dataset": "dataset",
        "type starting with $": "type",
        "dataset starting with $": "dataset",
        "unicity_id starting with $": "unicity_id",
        "type containing a dot": "type",
        "type not a string": "type",
        "dataset not a string": "dataset",
        "config not a string": "config",
        "config an operator object": "config",
        "split a list": "split",
        "split a boolean": "split",
    }
    for name, job in malformed.items():
        assert reported[job[ID]].startswith(expected_field[name]), (name, reported[job[ID]])


def test_jobs_with_unknown_statuses_are_never_touched(store: Store, resources):
    odd = unknown_status_jobs()
    good = good_jobs()
    raw(store.jobs).insert_many([*odd.values(), *good])
    before = {job[ID]: job for job in store.jobs.find({ID: {"$in": [j[ID] for j in odd.values()]}})}
    result = run_kill_zombies(resources, override_brake=True)
    assert result.success
    assert {job[ID]: job for job in store.jobs.find({ID: {"$in": list(before)}})} == before
    assert store.events.count_documents({ID: {"$in": list(before)}}) == 0
    assert step_metadata(result, "report_cleanup")["finalized"] == 4


def test_jobs_with_unknown_statuses_are_reported_in_the_run_metadata(store: Store, resources):
    odd = unknown_status_jobs()
    raw(store.jobs).insert_many([*odd.values(), *good_jobs()])
    result = run_kill_zombies(resources, override_brake=True, dry_run=True)
    reported = {ObjectId(item["id"]) for item in step_metadata(result, "find_zombies").get("malformed_jobs", [])}
    assert {job[ID] for job in odd.values()} <= reported


# --- bad configuration: refused before any read or write -----------------------------------------------------

#: The issue's cases go through a whole Dagster run; every case is refused by the policy itself (tests/test_policy.py).
RUN_CASES = [
    case
    for case in BAD_POLICIES
    if next(iter(case[0]))
    in {
        "heartbeat_timeout_seconds",
        "max_duration_seconds",
        "max_duration_seconds_by_type",
        "batch_size",
        "crashed_retry_limit",
        "claim_lease_seconds",
    }
]


@pytest.mark.parametrize("values, named, across_fields", RUN_CASES, ids=[case_id(case) for case in RUN_CASES])
def test_a_bad_policy_is_refused_before_any_read_or_write_with_a_message_naming_the_field(
    store: Store, mongo_url: str, monkeypatch, values: dict, named: list[str], across_fields: bool
):
    """As a deployment configures it, in the run config: the first step takes the policy, refuses it in one line
    (Dagster checks only the types before launch), and the run ends there, before any command to a database."""
    store.jobs.insert_many([zombie("u/z1"), zombie("u/z2"), healthy("u/alive")])
    before = documents(store)
    indexes = {c.name: c.index_information() for c in (store.jobs, store.cache, store.events)}
    monkeypatch.setenv(URL_ENV, mongo_url)
    # a timeout no other test uses: the run must create its own client, which the listener would see
    resources = make_resources(store, timeout_ms=4_321)
    client = store.jobs.database.client
    counters = opcounters(client)

    with logging_every_client(HANDSHAKES) as log:
        result = run_kill_zombies(
            resources, run_config={"resources": {"zombie_policy": {"config": values}}}, override_brake=True
        )

    assert opcounters(client) == counters
    assert [e.step_key for e in result.all_events if e.event_type_value == "STEP_START"] == ["plan_and_recover"]
    assert log.names == [], f"the refused run sent {log.names}"
    assert not result.success
    [failure] = step_failure_messages(result)
    message = result_cause(result)
    assert "\n" not in message and message.startswith("invalid zombie policy: ") and message in failure
    for name in named:
        assert name in message, message
    assert documents(store) == before
    assert {c.name: c.index_information() for c in (store.jobs, store.cache, store.events)} == indexes
    report_figures(
        f"bad_policy:{case_id((values, named, across_fields))}",
        {
            "refused": True,
            "field_named": named[0],
            "ops_started": 0,
            "commands_sent": len(log.names),
            "opcounter_delta": 0,
        },
    )


def test_an_override_for_a_job_type_the_queue_does_not_know_warns(store: Store, resources, mongo_url):
    store.jobs.insert_many([zombie("u/z1"), zombie("u/z2", job_type="/first-rows")])
    resources["zombie_policy"] = ZombiePolicyResource(
        max_duration_seconds_by_type={"/first-rows": 3600, "/frist-rows": 3600}
    )
    result = run_kill_zombies(resources, override_brake=True)
    assert result.success
    warnings = [r.user_message for r in result.logs if level(r) >= 30 and "/frist-rows" in (r.user_message or "")]
    assert warnings, [r.user_message for r in result.logs if level(r) >= 30]
    assert "/first-rows'" not in warnings[0].split("/frist-rows")[0][-40:]  # the known type is not named
    assert step_metadata(result, "plan_and_recover")["unknown_override_types"] == ["/frist-rows"]
    assert step_metadata(result, "report_cleanup")["finalized"] == 2  # a warning, not a refusal


def test_a_run_asked_for_a_job_type_the_deployment_never_had_is_refused_naming_the_known_ones(store: Store, resources):
    store.jobs.insert_many([zombie("u/z1"), zombie("u/z2", job_type="/first-rows")])

    result = run_kill_zombies(resources, job_types=["/no-such-type"])

    assert not result.success
    [cause] = [message for message in step_failure_messages(result) if "job_types" in message]
    assert "job_types names types this deployment has never had: ['/no-such-type']" in cause
    assert "its types: ['/first-rows', '/splits']" in cause
    assert len([event for event in result.all_events if event.event_type_value == "STEP_UP_FOR_RETRY"]) == 0
    assert store.events.count_documents({}) == 0  # refused before anything was written


def test_overrides_for_known_types_do_not_warn(store: Store, resources):
    store.jobs.insert_many([zombie("u/z1"), zombie("u/z2", job_type="/first-rows")])
    resources["zombie_policy"] = ZombiePolicyResource(max_duration_seconds_by_type={"/first-rows": 3600})
    result = run_kill_zombies(resources, override_brake=True)
    assert result.success
    assert not [r for r in result.logs if level(r) >= 30 and "job type" in (r.user_message or "").lower()]


# --- no query injection through job type or dataset names ----------------------------------------------------

#: Strings that would widen or change a query if they ever became operators or field names.
CRAFTED = ['{"$gt": ""}', '{"$ne": null}', "$where", "$ne", "$gt", "a.b", "$exists", "this.status == 'started'"]


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
def recorded(mongo_url: str, store: Store) -> Iterator[tuple[Store, CommandLog]]:
    """The store through a client that logs every command it sends."""
    with logged_store(mongo_url, store) as logged:
        yield logged


def crafted_queue(store: Store) -> dict[str, list[JobDocument]]:
    """Zombies with crafted but well-formed names, malformed crafted ones, and bystanders with fresh results."""
    crafted_zombies = [
        zombie("u/plain", job_type='{"$gt": ""}'),
        zombie("u/plain-2", job_type='{"$ne": null}'),
        zombie('{"$gt": ""}', job_type="/splits"),
        zombie("u/$where", job_type="/config-names", config="$ne", split="a.b"),
        zombie("u/a.b", job_type="/first-rows", config='{"$exists": true}', split="$gt"),
        zombie("u/js", job_type="this.status == 'started'".replace(".", "_")),
    ]
    crafted_malformed = [
        zombie("u/m1", job_type="$where"),
        zombie("u/m2", job_type="a.b"),
        zombie("$ne"),
        zombie("$gt", job_type="$exists"),
    ]
    bystanders = [
        healthy("u/alive", job_type="/splits"),
        healthy("u/alive-2", job_type='{"$gt": ""}'),
        job_document(
            job_type="/splits", dataset="u/done", status=Status.SUCCESS, started_at=ago(5000), finished_at=ago(4000)
        ),
        job_document(job_type="/splits", dataset="u/waiting", status=Status.WAITING),
        zombie("u/other-type", job_type="/parquet"),  # a zombie of another type: only the full run may touch it
    ]
    store.jobs.insert_many(crafted_zombies + crafted_malformed + bystanders)
    entries = [cache_document(job, ago(30)) for job in bystanders[:3]]  # fresh successes anyone widening would hit
    entries += [
        cache_document(job, ago(86_400), http_status=500, error_code="X", failed_runs=1) for job in crafted_zombies
    ]
    store.cache.insert_many(entries)
    return {"zombies": crafted_zombies, "malformed": crafted_malformed, "bystanders": bystanders}


def test_crafted_names_select_only_their_own_literal_jobs(recorded, store: Store):
    store.ensure_indexes()
    crafted_queue(store)
    recording_store, log = recorded
    policy = ZombiePolicy(claim_lease_seconds=0)

    before = documents(store)
    report = run_cleanup(recording_store, policy, "run-gt", job_types=['{"$gt": ""}'], override_brake=True)
    assert report.counts["finalized"] == 1
    [finalized] = store.jobs.find({Job.STATUS: Status.ERROR})
    assert finalized[Job.TYPE] == '{"$gt": ""}' and finalized[Job.DATASET] == "u/plain"
    assert found(store.jobs.find_one({Job.DATASET: "u/alive-2"}))[Job.STATUS] == Status.STARTED  # same type, alive

    for names in (["$where"], ["a.b"], ["$exists"]):  # types of the queue, none of whose jobs is a zombie
        snapshot = documents(store)
        report = run_cleanup(recording_store, policy, f"run-{names[0]}", job_types=names, override_brake=True)
        assert report.counts["finalized"] == 0, names
        assert documents(store) == snapshot, names
    for names in (["$ne"], ["$gt", "$exists"], ['{"$ne": null}x']):  # a name no job has: refused, nothing written
        snapshot = documents(store)
        with pytest.raises(UnknownJobTypes, match="never had"):
            run_cleanup(recording_store, policy, f"run-{names[0]}", job_types=names, override_brake=True)
        assert documents(store) == snapshot, names
    assert before  # (the first run changed exactly one job, checked above)


def test_a_full_run_over_crafted_names_touches_exactly_the_zombies_and_never_uses_a_name_as_a_key(
    recorded, store: Store
):
    store.ensure_indexes()
    queue = crafted_queue(store)
    recording_store, log = recorded
    bystander_ids = [job[ID] for job in queue["bystanders"][:4]]
    malformed_ids = [job[ID] for job in queue["malformed"]]
    bystanders_before = sorted(store.jobs.find({ID: {"$in": bystander_ids + malformed_ids}}), key=lambda d: str(d[ID]))
    fresh_entries_before = sorted(store.cache.find({Cache.UPDATED_AT: {"$gt": ago(3600)}}), key=lambda d: str(d[ID]))
    policy = ZombiePolicy(
        claim_lease_seconds=0, max_duration_seconds_by_type={'{"$gt": ""}': 100_000, '{"$ne": null}': 5_000}
    )
    with pytest.raises(PolicyError):  # an override for a name no job type can have is refused before any query
        ZombiePolicy(max_duration_seconds_by_type={"$where": 5_000, "a.b": 5_000, "$ne": 5_000})

    report = run_cleanup(recording_store, policy, "full-run", override_brake=True)

    zombie_ids = [job[ID] for job in queue["zombies"]] + [queue["bystanders"][4][ID]]
    assert report.counts["finalized"] == len(zombie_ids)
    assert {j[ID] for j in store.jobs.find({Job.STATUS: Status.ERROR})} == set(zombie_ids)
    assert (
        sorted(store.jobs.find({ID: {"$in": bystander_ids + malformed_ids}}), key=lambda d: str(d[ID]))
        == bystanders_before
    )
    assert (
        sorted(
            store.cache.find(
                {Cache.UPDATED_AT: {"$gt": ago(3600)}, Cache.ERROR_CODE: {"$ne": "JobManagerCrashedError"}}
            ),
            key=lambda d: str(d[ID]),
        )
        == fresh_entries_before
    )
    for job in queue["zombies"]:  # each error entry sits at its literal key, exactly once
        key = cache_key_of_job(job)
        matching = [
            e for e in store.cache.find({Cache.KIND: key[Cache.KIND]}) if all(e.get(n) == key[n] for n in CACHE_KEY)
        ]
        assert len(matching) == 1 and matching[0][Cache.ERROR_CODE] == "JobManagerCrashedError", key
    assert store.events.count_documents({Event.STATE: EventState.DONE}) == len(zombie_ids)

    keys: set = set()
    strings: set = set()
    for command in log.commands:
        keys_and_strings(command, keys, strings)
    assert not {key for key in keys for name in CRAFTED if name in key and name not in ("$ne", "$gt", "$exists")}
    # "$ne", "$gt" and "$exists" are operators the code itself uses; as names they must be values
    used_as_values = {name for name in CRAFTED if name in strings}
    assert {'{"$gt": ""}', '{"$ne": null}', "$ne", "$gt", "a.b"} <= used_as_values
    allowed_keys = _allowed_keys()
    unexpected = {key for key in keys if key not in allowed_keys}
    assert not unexpected, unexpected
    report_figures(
        "query_injection",
        {
            "commands_recorded": len(log.commands),
            "distinct_keys_in_commands": len(keys),
            "keys_outside_our_field_and_operator_names": len(unexpected),
            "crafted_names_seen_as_values": len(used_as_values),
            "zombies_finalized": report.counts["finalized"],
            "bystanders_and_malformed_changed": 0,
        },
    )


def _allowed_keys() -> set:
    """Field names of our documents and the command and operator names the code uses."""
    job_fields = set().union(*(generation.job_fields for generation in QUEUE_GENERATIONS.values()))
    fields = set(job_fields) | {ID}
    fields |= {value for name, value in vars(Cache).items() if name.isupper()}
    fields |= {value for name, value in vars(Event).items() if name.isupper()}
    fields |= {value for name, value in vars(ScheduledRetry).items() if name.isupper()}
    fields |= {f"{Event.JOB}.{name}" for name in job_fields}
    # the error entry's free-form content and details, and the policy snapshot stored in each event
    fields |= {
        "error",
        "reason",
        "last_heartbeat",
        "threshold_seconds",
        "run_id",
        "job_id",
        "result",
        "type",
        "seconds",
    }
    fields |= {"runner_version"}  # the summary of the entry an error replaced, kept in the event
    fields |= {DETAIL_QUARANTINED}  # the error entry's details say whether the pair is quarantined
    fields |= set(ZombiePolicy.model_fields)
    operators = {
        "$in",
        "$nin",
        "$lt",
        "$lte",
        "$gt",
        "$gte",
        "$cond",
        "$eq",
        "$literal",
        "$ne",
        "$or",
        "$and",
        "$exists",
        "$not",
        "$type",
        "$set",
        "$natural",
        "$hint",
    }
    command_keys = {
        "find",
        "filter",
        "sort",
        "limit",
        "batchSize",
        "projection",
        "hint",
        "update",
        "updates",
        "q",
        "u",
        "upsert",
        "multi",
        "insert",
        "documents",
        "ordered",
        "delete",
        "deletes",
        "aggregate",
        "pipeline",
        "cursor",
        "$match",
        "$group",
        "$sort",
        "$count",
        "$project",
        "count",
        "n",
        "$db",
        "lsid",
        "id",
        "txnNumber",
        "$clusterTime",
        "clusterTime",
        "signature",
        "hash",
        "keyId",
        "getMore",
        "collection",
        "listIndexes",
        "createIndexes",
        "indexes",
        "key",
        "name",
        "unique",
        "distinct",
        "query",
        "readConcern",
        "writeConcern",
        "singleBatch",
        "killCursors",
        "cursors",
        "endSessions",
        "$readPreference",
        "mode",
        "comment",
        "maxTimeMS",
        "let",
        "skip",
        "$sum",
        "$ifNull",
        "$limit",
        "$skip",
        "apiVersion",
        "bypassDocumentValidation",
        "collation",
        "arrayFilters",
        "ping",
        "listCollections",
        "nameOnly",
        "hello",
        "startTransaction",
        "autocommit",
        "commitTransaction",
        "abortTransaction",
        "recoveryToken",
    }
    return fields | operators | command_keys


def test_the_stale_filter_keeps_crafted_names_as_values():
    policy = ZombiePolicy(
        max_duration_seconds_by_type={name: 5_000 for name in CRAFTED if job_type_problem(name) is None}
    )
    query = stale_filter(policy, utc_now(), job_types=CRAFTED)
    keys: set = set()
    strings: set = set()
    keys_and_strings(query, keys, strings)
    assert keys <= {
        Job.STATUS,
        Job.STARTED_AT,
        Job.LAST_HEARTBEAT,
        Job.TERMINATED_AT,
        Job.TYPE,
        "$or",
        "$lt",
        "$in",
        "$nin",
    }
    assert set(CRAFTED) <= strings


def test_a_crafted_partition_key_cleans_only_its_literal_type(store: Store, resources):
    crafted_queue(store)
    result = run_kill_zombies(resources, partition_key='{"$gt": ""}', override_brake=True)
    assert result.success, error_text(result)
    assert [j[Job.DATASET] for j in store.jobs.find({Job.STATUS: Status.ERROR})] == ["u/plain"]


def test_run_config_refuses_an_operator_object_as_a_job_type(store: Store, resources):
    with pytest.raises(dg.DagsterInvalidConfigError):
        kill_zombies_job.execute_in_process(
            run_config={"ops": {"plan_and_recover": {"config": {"job_types": [{"$gt": ""}]}}}}, resources=resources
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
