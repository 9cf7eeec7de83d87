"""The cache entries of a batch of jobs: found by their full key, by indexed queries."""

from bson import ObjectId

from tests.helpers import HANDSHAKES, ago, job_document, logged_store
from zombie_pipeline.cleanup.detection import query_plan_of
from zombie_pipeline.queue.audit_documents import Event, ZombieEvent
from zombie_pipeline.queue.cache import Cache, ErrorCode, cache_key_of_job
from zombie_pipeline.queue.cache_entries import (
    DETAIL_JOB_ID,
    current_runner_version,
    entries_of_jobs,
    is_fresher,
    key_of,
    step_version,
    written_for,
)
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document


def test_each_job_gets_the_entry_of_its_own_full_key_only(store):
    split_job = job_document("/split-rows", "u/a", config="default", split="train")
    other_split = job_document("/split-rows", "u/a", config="default", split="test")
    dataset_job = job_document("/dataset-info", "u/a")
    without_entry = job_document("/dataset-info", "u/b")
    store.cache.insert_many([cache_document(job, utc_now()) for job in (split_job, other_split, dataset_job)])

    found = entries_of_jobs(store.cache, [split_job, dataset_job, without_entry], {Cache.CONTENT: 0})

    assert set(found) == {key_of(cache_key_of_job(split_job)), key_of(cache_key_of_job(dataset_job))}
    assert found[key_of(cache_key_of_job(split_job))][Cache.SPLIT] == "train"
    assert all(Cache.CONTENT not in entry for entry in found.values())


def test_one_read_for_a_batch_whatever_its_job_types_with_types_only_as_values(store, mongo_url):
    jobs = [job_document(job_type, f"u/d-{i}") for i in range(30) for job_type in ("/a", "$where", "/c", "/d", "/e")]
    store.cache.insert_many([cache_document(job, utc_now()) for job in jobs])
    with logged_store(mongo_url, store) as (logged, log):
        found = entries_of_jobs(logged.cache, jobs, {Cache.UPDATED_AT: 1})

    assert len(found) == 150
    [read] = log.named("aggregate")
    assert [name for name in log.names if name not in HANDSHAKES] == ["aggregate"]  # one command, however many types
    datasets, kinds = read["pipeline"][0]["$match"], read["pipeline"][1]["$match"]
    assert datasets == {
        Cache.DATASET: {"$in": sorted({f"u/d-{i}" for i in range(30)})}
    }  # the index's first field first
    assert kinds == {Cache.KIND: {"$in": ["$where", "/a", "/c", "/d", "/e"]}}  # a type name is only ever a value


def test_the_read_of_a_batch_is_planned_on_the_deployments_dataset_index(store):
    store.ensure_indexes()
    jobs = [job_document(job_type, f"u/d-{i}") for i in range(20) for job_type in ("/a", "/b")]
    store.cache.insert_many(
        [cache_document(job, utc_now()) for job in jobs]
        + [cache_document(job_document("/a", f"other/d-{i}"), utc_now()) for i in range(200)]
    )
    keys = [key_of(cache_key_of_job(job)) for job in jobs]
    pipeline = [
        {"$match": {Cache.DATASET: {"$in": sorted({key[1] for key in keys})}}},
        {"$match": {Cache.KIND: {"$in": ["/a", "/b"]}}},
    ]

    explained = store.cache.database.command(
        "explain", {"aggregate": store.cache.name, "pipeline": pipeline, "cursor": {}}, verbosity="executionStats"
    )

    plan = query_plan_of(explained)
    assert "IXSCAN" in str(plan["queryPlanner"]["winningPlan"])  # never a collection scan
    assert plan["executionStats"]["totalDocsExamined"] <= 40 + 1  # the batch's entries, not the 200 others


def test_our_entry_is_recognized_by_its_job_and_its_error_code_only():
    job_id = ObjectId()
    event: ZombieEvent = {ID: job_id, Event.ERROR_CODE: ErrorCode.CRASHED}
    ours = {Cache.DETAILS: {DETAIL_JOB_ID: str(job_id)}, Cache.ERROR_CODE: ErrorCode.CRASHED}

    assert written_for(ours, event)
    assert not written_for(None, event)
    assert not written_for({**ours, Cache.ERROR_CODE: ErrorCode.EXCEEDED_MAX_DURATION}, event)
    assert not written_for({**ours, Cache.DETAILS: {DETAIL_JOB_ID: str(ObjectId())}}, event)
    assert not written_for({**ours, Cache.DETAILS: "not a document"}, event)


def test_an_entry_is_fresher_than_a_job_when_it_was_updated_after_the_job_started():
    job = {Job.STARTED_AT: ago(600)}

    assert is_fresher({Cache.UPDATED_AT: ago(300)}, job)
    assert not is_fresher({Cache.UPDATED_AT: ago(900)}, job)
    assert not is_fresher({}, job)


def test_a_steps_version_is_the_one_of_its_kinds_newest_success_and_none_where_it_never_succeeded(store):
    def entry(kind: str, dataset: str, http_status: int, version: object) -> dict:
        job = job_document(kind, dataset)
        return {**cache_document(job, utc_now()), Cache.HTTP_STATUS: http_status, Cache.JOB_RUNNER_VERSION: version}

    store.cache.insert_many(
        [
            entry("/parquet", "u/old", 200, 2),
            entry("/parquet", "u/new", 200, 3),
            entry("/parquet", "u/error", 500, 7),  # an error, maybe ours: not the step's word
            entry("/parquet", "u/odd", 200, "3.0.0"),  # not a number
            entry("/splits", "u/other-kind", 200, 9),
            entry("/never-succeeded", "u/a", 501, 4),
        ]
    )

    assert step_version(store.cache, "/parquet") == 3
    assert step_version(store.cache, "/never-succeeded") is None


def test_an_error_entry_carries_the_higher_of_the_steps_version_and_the_previous_entrys_or_none():
    assert current_runner_version(None, 3) == 3
    assert current_runner_version({Cache.JOB_RUNNER_VERSION: 4}, 3) == 4  # a version only grows
    assert current_runner_version({Cache.JOB_RUNNER_VERSION: 2}, None) == 2
    assert current_runner_version({Cache.JOB_RUNNER_VERSION: True}, None) is None
    assert current_runner_version({}, None) is None
