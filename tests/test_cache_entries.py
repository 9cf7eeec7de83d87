"""The cache entries of a batch of jobs: found by their full key, by indexed queries."""

from tests.helpers import job_document, logged_store
from zombie_pipeline.cache_entries import entries_of_jobs, key_of
from zombie_pipeline.documents import Cache, cache_key_of_job, utc_now
from zombie_pipeline.simulate import cache_document


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


def test_one_query_per_job_type_with_the_type_only_as_a_value(store, mongo_url):
    jobs = [job_document(job_type, f"u/d-{i}") for i in range(30) for job_type in ("/a", "$where", "/c")]
    store.cache.insert_many([cache_document(job, utc_now()) for job in jobs])
    with logged_store(mongo_url, store) as (logged, log):
        found = entries_of_jobs(logged.cache, jobs, {Cache.UPDATED_AT: 1})

    assert len(found) == 90
    assert sorted(query["filter"][Cache.KIND] for query in log.named("find")) == ["$where", "/a", "/c"]
