"""Live workers and two to four cleanups, each in a process of its own, on one queue: each zombie is finalized
once, never a live job, and a worker that comes back in time keeps its job.

On a server of the test's own: cleanups that share it with live workers load it as nothing else in the
suite does. The workers and the cleanups are the actors of ``tests/faults/actors``.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from bson import ObjectId

from tests.faults.scenario import (
    CACHE,
    FULL_SIZE,
    QUEUE,
    assert_nothing_lost_or_doubled,
    audit,
    connect,
    faults_store,
    last_report,
    prior_failed_runs,
    start_actor,
)
from tests.figures import report_figures
from tests.helpers import found, job_document
from tests.servers import LocalServer
from zombie_pipeline.cleanup.detection import detect, stale_filter
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState
from zombie_pipeline.queue.cache import CACHE_KEY, HTTP_OK, Cache, CacheEntry, cache_key_of_job
from zombie_pipeline.queue.jobs import DEFAULT_JOBS_COLLECTION, ID, Job, JobDocument, Status
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.simulation.workload import JOB_TYPES

LIVE_SIZES: dict[str, dict[str, Any]] = {
    "default": {"zombies": 120, "healthy": 120, "cleanups": 3, "revived_fraction": 0.1},
    "full": {
        "zombies": 1_000,
        "healthy": 1_000,
        "cleanups": int(os.environ.get("ZOMBIE_FAULTS_CLEANUPS", "4")),
        "revived_fraction": 0.1,
    },
}
LIVE_POLICY: dict[str, Any] = {
    "heartbeat_timeout_seconds": 300,
    "max_duration_seconds": 86_400,
    "batch_size": 100,
    "claim_lease_seconds": 900,
}
LIVE_BATCH_SIZES = (100, 37, 61, 13)
LIVE_HALF_OF_TYPES = [job_type.name for job_type in JOB_TYPES[::2]]


def _live_jobs(
    zombies: int, healthy: int, now: dt.datetime, seed: int
) -> tuple[list[JobDocument], list[JobDocument], list[CacheEntry]]:
    rng = random.Random(seed)
    started_at = now - dt.timedelta(hours=1)
    zombie_jobs: list[JobDocument] = []
    healthy_jobs: list[JobDocument] = []
    entries: list[CacheEntry] = []
    for kind, count, target, heartbeat in (
        ("zombie", zombies, zombie_jobs, now - dt.timedelta(minutes=30)),
        ("healthy", healthy, healthy_jobs, now - dt.timedelta(seconds=5)),
    ):
        for i in range(count):
            job_type = JOB_TYPES[i % len(JOB_TYPES)]
            config = None if job_type.level == "dataset" else rng.choice(["default", "en"])
            split = "train" if job_type.level == "split" else None
            job = job_document(
                job_type.name,
                f"user{i % 40}/{kind}-{i}",
                config,
                split,
                started_at=started_at,
                last_heartbeat=heartbeat,
            )
            target.append(job)
            if rng.random() < 0.5:  # an older result of the same step
                entries.append(
                    cache_document(
                        job, started_at - dt.timedelta(days=1), http_status=500, error_code="X", failed_runs=1
                    )
                )
    return zombie_jobs, healthy_jobs, entries


@pytest.mark.parametrize(
    "size",
    [
        "default",
        pytest.param("full", marks=FULL_SIZE),
    ],
)
def test_concurrent_cleanups_with_live_workers_finalize_each_zombie_once_and_never_a_live_job(
    server: LocalServer, tmp_path: Path, size: str
):
    sizes = LIVE_SIZES[size]
    store = faults_store(connect(server.url))
    store.ensure_indexes()
    databases = {"url": server.url, "queue": QUEUE, "cache": CACHE}
    now = utc_now()
    zombie_jobs, healthy_jobs, entries = _live_jobs(sizes["zombies"], sizes["healthy"], now, seed=17)
    store.jobs.insert_many(zombie_jobs + healthy_jobs, ordered=False)
    store.cache.insert_many(entries, ordered=False)
    zombie_ids = [job[ID] for job in zombie_jobs]
    healthy_ids = [job[ID] for job in healthy_jobs]
    revived_ids = zombie_ids[:: int(1 / sizes["revived_fraction"])]
    prior = prior_failed_runs(store, zombie_ids)
    assert len(detect(store.jobs, ZombiePolicy(**LIVE_POLICY), utc_now()).candidates) == len(zombie_ids)

    spread = 0.05 * sizes["zombies"]
    go_at = time.time() + 4.0
    stop_file = tmp_path / "stop"
    worker = start_actor(
        "worker_actor",
        tmp_path,
        {
            **databases,
            "seed": 5,
            "healthy": [str(i) for i in healthy_ids],
            "revived": [str(i) for i in revived_ids],
            "go_at": go_at,
            "spread_seconds": spread,
            "finish_fraction": 0.02,
            "pause": 0.2,
            "stop_file": str(stop_file),
        },
    )
    cleanups = []
    try:
        assert found(worker.stdout).readline().strip() == "ready", found(worker.stderr).read()
        for n in range(sizes["cleanups"]):
            # different batch sizes, staggered starts and one run limited to some job types (as a
            # partitioned run would be), so that claims and finalizations of the runs interleave
            policy = {**LIVE_POLICY, "batch_size": LIVE_BATCH_SIZES[n % len(LIVE_BATCH_SIZES)]}
            cleanups.append(
                start_actor(
                    "cleanup_actor",
                    tmp_path,
                    {
                        **databases,
                        "policy": policy,
                        "run_id": f"cleanup-{n}",
                        "go_at": go_at + 0.4 * n,
                        "job_types": LIVE_HALF_OF_TYPES if n == 1 else None,
                    },
                )
            )
        outputs = [process.communicate(timeout=1_800) for process in cleanups]
        for process, (_out, err) in zip(cleanups, outputs):
            assert process.returncode == 0, err[-3000:]
        reports = [last_report(out) for out, _ in outputs]
        time.sleep(1.0)  # a last heartbeat round
        stop_file.touch()
        worker_out, worker_err = worker.communicate(timeout=300)
        assert worker.returncode == 0, worker_err[-3000:]
        worker_report = last_report(worker_out)
    finally:
        stop_file.touch()
        for process in [worker, *cleanups]:
            if process.poll() is None:
                process.kill()
                process.wait()

    jobs = {job[ID]: job for job in store.jobs.find()}
    events = list(store.events.find())
    events_by_job = Counter(event[ID] for event in events)
    error_jobs = {job_id for job_id in zombie_ids if jobs[job_id][Job.STATUS] == Status.ERROR}
    won = Counter(job_id for report in reports for job_id in report["won"])
    job_updates_modified = sum(
        report["writes"].get(f"update:{DEFAULT_JOBS_COLLECTION}", {}).get("nModified", 0) for report in reports
    )
    entries_now = {tuple(e.get(n) for n in CACHE_KEY): e for e in store.cache.find()}
    success_overwritten = 0
    for job_id in map(ObjectId, worker_report["success_writes"]):
        entry = entries_now.get(tuple(cache_key_of_job(jobs[job_id]).values()))
        if (
            entry is None
            or entry.get(Cache.HTTP_STATUS) != HTTP_OK
            or entry[Cache.CONTENT].get("job_id") != str(job_id)
        ):
            success_overwritten += 1
    figures = {
        "zombies": len(zombie_ids),
        "healthy": len(healthy_ids),
        "revived_zombies": len(revived_ids),
        "cleanups": len(reports),
        "cleanup_seconds": [report["seconds"] for report in reports],
        "claimed_per_run": [report["counts"].get("claimed", 0) for report in reports],
        "claim_refused_per_run": [report["counts"].get("claimed_by_another_cleanup", 0) for report in reports],
        "finalized_per_run": [report["counts"].get("finalized", 0) for report in reports],
        "compare_and_set_lost_to_live_worker_per_run": [
            report["counts"].get("lost_to_live_worker", 0) for report in reports
        ],
        "zombies_finalized": len(error_jobs),
        "double_finalizations_reported": sum(1 for count in won.values() if count > 1),
        "double_finalizations_written": job_updates_modified - len(error_jobs),
        "healthy_finalized": sum(1 for job_id in healthy_ids if jobs[job_id][Job.STATUS] == Status.ERROR),
        "healthy_finished_by_worker": worker_report["healthy_finished"],
        "healthy_finish_refused": worker_report["healthy_finish_refused"],
        "heartbeats_written": worker_report["beats"],
        "revived_finished_by_worker_first": worker_report["revived_worker_won"],
        "revived_finalized_by_cleanup_first": worker_report["revived_cleanup_won"],
        "successes_written_by_workers": len(worker_report["success_writes"]),
        "successes_overwritten_in_cache": success_overwritten,
        "zombies_left": sum(1 for job_id in zombie_ids if jobs[job_id][Job.STATUS] == Status.STARTED)
        + store.jobs.count_documents(stale_filter(ZombiePolicy(**LIVE_POLICY), utc_now())),
        "events_per_finalized_job": sorted({events_by_job[job_id] for job_id in error_jobs}),
        "events_for_jobs_not_finalized": sum(1 for event in events if event[ID] not in error_jobs),
        "events_not_done": sum(1 for event in events if event[Event.STATE] != EventState.DONE),
    }
    # every zombie is accounted for, exactly once: finalized by one cleanup, or finished by its revived worker
    figures.update(
        {
            k: v
            for k, v in audit(store, sorted(error_jobs), prior).items()
            if k.startswith(("lost_", "duplicate_", "cache_", "retries"))
        }
    )
    figures["lost_zombies_neither_finalized_nor_finished"] = sum(
        1 for job_id in zombie_ids if jobs[job_id][Job.STATUS] not in (Status.ERROR, Status.SUCCESS)
    )
    report_figures(f"live_workers:{size}", figures)

    assert figures["double_finalizations_reported"] == 0
    assert figures["double_finalizations_written"] == 0
    assert figures["healthy_finalized"] == 0
    assert figures["healthy_finish_refused"] == 0
    assert figures["successes_overwritten_in_cache"] == 0
    assert figures["zombies_left"] == 0
    assert figures["events_per_finalized_job"] == [1]
    assert figures["events_for_jobs_not_finalized"] == 0
    assert figures["events_not_done"] == 0
    assert figures["lost_zombies_neither_finalized_nor_finished"] == 0
    assert len(error_jobs) + worker_report["revived_worker_won"] == len(zombie_ids)
    assert sum(figures["finalized_per_run"]) == len(error_jobs)
    assert_nothing_lost_or_doubled(figures)
