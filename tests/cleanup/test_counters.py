"""The deployment's counters as a recount of what they count (``cleanup/counters.py``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from pymongo import MongoClient, monitoring

from tests.helpers import CommandLog, found
from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.counters import CountersInDoubt
from zombie_pipeline.cleanup.side_collections import SideCollections
from zombie_pipeline.queue.cache import CACHE_METRICS_COLLECTION, CacheMetric
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.job_metrics import JOB_METRICS_COLLECTION, JobMetric
from zombie_pipeline.queue.jobs import Job, JobDocument, Status
from zombie_pipeline.queue.store import Document, Store
from zombie_pipeline.queue.worker_type_counts import WORKER_SIZE_METRICS_COLLECTION, WorkerSizeMetric
from zombie_pipeline.simulation.shapes import job_document
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workload import Workload

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


# --- the counters a dead pass may have moved: set from a recount ------------------------------------------


GENERATION = QUEUE_GENERATIONS["2026-05"]
QUEUE = Workload(finished=0, crashed=4, never_heartbeated=0, terminated=0, overdue=0, running=6, waiting=8, seed=2)


def through(mongo_url: str, store: Store, listener: monitoring.CommandListener) -> Store:
    """``store``'s collections through a client of their own that ``listener`` hears."""
    client: MongoClient[Document] = MongoClient(mongo_url, tz_aware=True, tzinfo=dt.UTC, event_listeners=[listener])
    return Store.of(client[store.jobs.database.name], client[store.cache.database.name])


def job_metric(store: Store, job_type: str, status: str) -> int:
    return found(store.job_metrics.find_one({JobMetric.JOB_TYPE: job_type, JobMetric.STATUS: status}))[JobMetric.TOTAL]


def knock_off(store: Store, job_type: str, status: str, by: int) -> None:
    store.job_metrics.update_one(
        {JobMetric.JOB_TYPE: job_type, JobMetric.STATUS: status}, {"$inc": {JobMetric.TOTAL: by}}
    )


def started_type(store: Store) -> str:
    return found(store.jobs.find_one({"status": Status.STARTED}))["type"]


def test_nothing_in_doubt_costs_no_command(store: Store, mongo_url: str):
    simulate(store, QUEUE)
    log = CommandLog()
    listened = through(mongo_url, store, log)
    assert counters.repair(listened, SideCollections.of(store, GENERATION), CountersInDoubt()) == 0
    assert log.names == []


def test_the_counters_in_doubt_are_set_to_their_recount_and_no_other(store: Store, mongo_url: str):
    simulate(store, QUEUE)
    job_type = started_type(store)
    knock_off(store, job_type, Status.STARTED, +5)  # a batch's finish whose counters a dead pass never moved
    knock_off(store, job_type, Status.WAITING, -2)  # not in doubt: left as it is (the deployment's own recount's)
    doubt = CountersInDoubt(job_metrics={(job_type, Status.STARTED)}, worker_sizes=True)
    log = CommandLog()
    listened = through(mongo_url, store, log)

    written = counters.repair(listened, SideCollections.of(store, GENERATION), doubt)

    assert written == 1
    recount = counters.recount(store, GENERATION)
    assert job_metric(store, job_type, Status.STARTED) == recount["jobTotalMetric"][(job_type, Status.STARTED)]
    assert job_metric(store, job_type, Status.WAITING) == recount["jobTotalMetric"][(job_type, Status.WAITING)] - 2
    # a round with a write, then one that finds nothing to write; the worker sizes: one round, nothing to write
    assert log.names == ["find", "aggregate", "update", "find", "aggregate", "find", "distinct", "aggregate"]


class _WorkerMovesAfterTheCount(monitoring.CommandListener):
    """Right after the repair's first count comes back, a worker starts a waiting job: its two writes (the job, then
    the counters) land between the repair's count and its write."""

    def __init__(self, move: Callable[[], None]) -> None:
        self.move = move
        self.moved = False

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "aggregate" and not self.moved:
            self.moved = True
            self.move()

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def test_a_workers_move_between_the_count_and_the_write_leaves_the_counters_exact(store: Store, mongo_url: str):
    simulate(store, QUEUE)
    waiting = found(store.jobs.find_one({"status": Status.WAITING}))
    job_type = waiting["type"]
    knock_off(store, job_type, Status.WAITING, +3)  # in doubt, and off

    def worker_starts_a_job() -> None:  # as the deployment's worker: the job, then its counters
        store.jobs.update_one({"_id": waiting["_id"]}, {"$set": {"status": Status.STARTED}})
        knock_off(store, job_type, Status.WAITING, -1)
        knock_off(store, job_type, Status.STARTED, +1)

    listener = _WorkerMovesAfterTheCount(worker_starts_a_job)
    listened = through(mongo_url, store, listener)
    doubt = CountersInDoubt(job_metrics={(job_type, Status.WAITING), (job_type, Status.STARTED)})

    counters.repair(listened, SideCollections.of(store, GENERATION), doubt)

    assert listener.moved
    assert counters.stored(store, GENERATION)["jobTotalMetric"] == counters.recount(store, GENERATION)["jobTotalMetric"]


def test_a_counter_with_no_document_yet_is_created_from_its_recount(store: Store):
    simulate(store, QUEUE)
    job: JobDocument = job_document("/brand-new-type", "user/new", status=Status.WAITING, generation="2026-05")
    store.jobs.insert_one(job)  # inserted by a pass that died before the counters
    doubt = CountersInDoubt(job_metrics={("/brand-new-type", Status.WAITING)})

    assert counters.repair(store, SideCollections.of(store, GENERATION), doubt) == 1
    assert job_metric(store, "/brand-new-type", Status.WAITING) == 1
