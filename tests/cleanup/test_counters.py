"""The deployment's counters as a recount of what they count (``cleanup/counters.py``)."""

from __future__ import annotations

import pytest

from zombie_pipeline.cleanup import counters
from zombie_pipeline.queue.documents import (
    CACHE_METRICS_COLLECTION,
    JOB_METRICS_COLLECTION,
    WORKER_SIZE_METRICS_COLLECTION,
    CacheMetric,
    Job,
    JobMetric,
    Status,
    WorkerSizeMetric,
)
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.simulation.simulator import Workload, simulate

WITH_COUNTERS = [name for name, generation in QUEUE_GENERATIONS.items() if generation.keeps(JOB_METRICS_COLLECTION)]


def small(store, generation: str):
    return simulate(
        store, Workload(finished=30, crashed=3, overdue=1, running=4, waiting=6, generation=generation, seed=5)
    )


@pytest.mark.parametrize("generation", WITH_COUNTERS)
def test_a_simulated_queue_keeps_every_counter_of_its_generation_equal_to_its_recount(store, generation):
    small(store, generation)
    queue = QUEUE_GENERATIONS[generation]

    recounted = counters.recount(store, queue)

    assert recounted == counters.stored(store, queue)
    waiting = sum(count for (_, status), count in recounted[JOB_METRICS_COLLECTION].items() if status == Status.WAITING)
    assert waiting == store.jobs.count_documents({Job.STATUS: Status.WAITING}) == 6
    assert set(recounted) == {
        name
        for name in (JOB_METRICS_COLLECTION, WORKER_SIZE_METRICS_COLLECTION, CACHE_METRICS_COLLECTION)
        if queue.keeps(name)
    }


def test_a_counter_moved_behind_the_recounts_back_is_set_to_the_recount_again(store):
    queue = QUEUE_GENERATIONS["2026-05"]
    small(store, queue.name)
    store.job_metrics.update_many({JobMetric.STATUS: Status.STARTED}, {"$inc": {JobMetric.TOTAL: 2}})
    store.worker_size_metrics.update_many({}, {"$inc": {WorkerSizeMetric.JOBS_COUNT: -1}})
    store.cache_metrics.update_many({}, {"$inc": {CacheMetric.TOTAL: 5}})
    assert counters.stored(store, queue) != counters.recount(store, queue)

    counters.write_recount(store, queue)

    assert counters.stored(store, queue) == counters.recount(store, queue)


def test_a_generation_without_counters_has_none_to_recount(store):
    queue = QUEUE_GENERATIONS["2023-01"]
    small(store, queue.name)

    assert counters.recount(store, queue) == {} == counters.stored(store, queue)
