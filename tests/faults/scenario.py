"""What the fault scenarios share: sizes, connections, a cleanup run in process, actors in processes, the final audit.

Each scenario prints its figures on a ``FIGURES {...}`` line (``pytest -s``) and
appends them as JSON lines to ``$ZOMBIE_FIGURES_FILE`` when set; docs/reliability.md
quotes them. The default suite runs small versions; ``ZOMBIE_FAULTS_FULL=1`` runs
the sizes of the report (1,000 zombies and 1,000 healthy jobs under live workers,
20 SIGKILLs).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from bson import ObjectId
from pymongo import MongoClient

from tests.helpers import LoggedResult, found
from tests.servers import REPO_ROOT
from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.causes import cause_of_event
from zombie_pipeline.config import CACHE_URL_ENV, QUEUE_URL_ENV
from zombie_pipeline.defs.resources import (
    Databases,
    ZombiePolicyResource,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import CacheOutcome, Event, EventState, RetryOutcome
from zombie_pipeline.queue.blockages import Blockage
from zombie_pipeline.queue.cache import CACHE_KEY, Cache, cache_key_of_job
from zombie_pipeline.queue.cache_entries import failed_runs_after_crash
from zombie_pipeline.queue.generations import QueueGeneration
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.locks import Lock
from zombie_pipeline.queue.past_jobs import PastJob
from zombie_pipeline.queue.store import Store

FULL = os.environ.get("ZOMBIE_FAULTS_FULL") == "1"
#: A parameter of the report's size: skipped, saying so, unless ``ZOMBIE_FAULTS_FULL=1``.
FULL_SIZE = [pytest.mark.slow, pytest.mark.skipif(not FULL, reason="set ZOMBIE_FAULTS_FULL=1")]
QUEUE = "faults_queue"
CACHE = "faults_cache"


def connect(url: str, timeout_ms: int = 5_000, **options: Any) -> MongoClient:
    return MongoClient(url, tz_aware=True, tzinfo=dt.UTC, serverSelectionTimeoutMS=timeout_ms, **options)


def faults_store(client: MongoClient, queue: str = QUEUE, cache: str = CACHE) -> Store:
    return Store.of(client[queue], client[cache])


def snapshot(client: MongoClient) -> dict[str, Any]:
    """Every document and every index of every user database."""
    state = {}
    for name in sorted(client.list_database_names()):
        if name in {"admin", "local", "config"}:
            continue
        for collection_name in sorted(client[name].list_collection_names()):
            collection = client[name][collection_name]
            state[f"{name}.{collection_name}"] = (
                sorted(collection.find(), key=lambda doc: str(doc[ID])),
                sorted(collection.index_information()),
            )
    return state


# --- kill_zombies_job in process -----------------------------------------------------------------------


def dagster_resources(timeout_ms: int = 3_000, **policy: Any) -> dict[str, Any]:
    return {
        "databases": Databases(
            queue_url=dg.EnvVar(QUEUE_URL_ENV),
            cache_url=dg.EnvVar(CACHE_URL_ENV),
            queue_database=QUEUE,
            cache_database=CACHE,
            timeout_ms=timeout_ms,
        ),
        "zombie_policy": ZombiePolicyResource(**policy),
    }


def step_seconds(result: LoggedResult) -> dict[str, float]:
    """Each op's duration, from the run's event log."""
    starts, seconds = {}, {}
    for record in result.logs:
        event = record.dagster_event
        if event is None or event.step_key is None:
            continue
        if event.event_type_value == "STEP_START":
            starts[event.step_key] = record.timestamp
        elif event.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE"):
            seconds[event.step_key] = record.timestamp - starts[event.step_key]
    return seconds


# --- actors: programs of their own, in processes of their own ------------------------------------------------


def start_actor(name: str, tmp_path: Path, args: dict[str, Any]) -> subprocess.Popen[str]:
    """``python -m tests.faults.actors.<name>``, its arguments in a JSON file, its stdout and stderr piped."""
    path = tmp_path / f"{name}-{len(list(tmp_path.glob(f'{name}-*.json')))}.json"
    path.write_text(json.dumps(args, default=str))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", f"tests.faults.actors.{name}", str(path)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def last_report(output: str) -> dict[str, Any]:
    return json.loads(output.strip().splitlines()[-1])


# --- checks of a final state ----------------------------------------------------------------------


def comparable_state(store: Store, original_ids: set) -> dict[str, Any]:
    """The state an operator cares about, without timestamps, run ids and ids chosen at random."""
    jobs, retries = {}, []
    for job in store.jobs.find():
        if job[ID] in original_ids:
            jobs[job[ID]] = {
                **{k: v for k, v in job.items() if k != Job.FINISHED_AT},
                "finished": Job.FINISHED_AT in job,
            }
        else:
            retries.append(sorted((k, repr(v)) for k, v in job.items() if k not in (ID, Job.CREATED_AT)))
    entries = {}
    for entry in store.cache.find():
        details = {k: v for k, v in (entry.get(Cache.DETAILS) or {}).items() if k not in ("run_id", Cache.DURATION)}
        entries[tuple(entry.get(n) for n in CACHE_KEY)] = {
            **{k: v for k, v in entry.items() if k not in (ID, Cache.UPDATED_AT, Cache.DURATION, Cache.DETAILS)},
            Cache.DETAILS: details,
        }
    events = {}
    for event in store.events.find():
        events[event[ID]] = {
            k: v
            for k, v in event.items()
            if k
            not in (
                Event.FINALIZED_AT,
                Event.DETECTION_SECONDS,  # counted to the finalization: a stamp of its run
                Event.RELEASE_LAG_SECONDS,  # the same
                Event.RUN_ID,
                Event.LEASE_OWNER,
                Event.LEASE_UNTIL,
                Event.DETECTED_AT,
                Event.COMPLETED_AT,
                Event.RETRY_JOB_ID,
            )
        }
    return {"jobs": jobs, "retries": sorted(retries), "cache": entries, "events": events}


def deployment_state(store: Store, generation: QueueGeneration) -> dict[str, Any]:
    """The deployment's collections beside the queue as a cleanup leaves them, without stamps that differ by run.

    ``pastJobs`` by job id and dataset (a run's duration counts to its finalization, a stamp of its own run),
    locks by key and owner, blockages by dataset, every counter the generation keeps as stored.
    """
    return {
        "counters": {
            name: sorted(values.items(), key=repr) for name, values in counters.stored(store, generation).items()
        },
        "past_jobs": sorted((str(past[ID]), past[PastJob.DATASET]) for past in store.past_jobs.find()),
        "locks": sorted((str(lock[ID]), lock.get(Lock.OWNER), lock.get(Lock.JOB_ID)) for lock in store.locks.find()),
        "blockages": sorted(blockage[Blockage.DATASET] for blockage in store.blockages.find()),
    }


def counters_off(store: Store, generation: QueueGeneration) -> dict[str, int]:
    """Per counter collection, the sum over its keys of how far each stored counter is from its recount."""
    stored, recounted = counters.stored(store, generation), counters.recount(store, generation)
    return {
        name: sum(abs(stored[name][key] - recounted[name][key]) for key in set(stored[name]) | set(recounted[name]))
        for name in recounted
    }


def audit(store: Store, zombie_ids: list[ObjectId], prior_failed_runs: dict[ObjectId, int]) -> dict[str, int]:
    """Count what the cleanup did to ``zombie_ids``; every 'lost' and 'duplicate' figure must be 0."""
    jobs = {job[ID]: job for job in store.jobs.find()}
    events = {event[ID]: event for event in store.events.find()}
    entries = {tuple(entry.get(name) for name in CACHE_KEY): entry for entry in store.cache.find()}
    figures: Counter[str] = Counter()
    retry_ids: Counter[str] = Counter()
    for job_id in zombie_ids:
        job = jobs[job_id]
        event = events.get(job_id)
        if job[Job.STATUS] == Status.STARTED:
            figures["lost_zombies_still_started"] += 1
            continue
        if job[Job.STATUS] != Status.ERROR or event is None:
            figures["lost_not_finalized_by_cleanup"] += 1
            continue
        figures["zombies_finalized"] += 1
        if job.get(Job.FINISHED_AT) != event[Event.FINALIZED_AT]:
            figures["duplicate_finished_at_mismatch"] += 1
        if event[Event.STATE] != EventState.DONE:
            figures["lost_event_not_done"] += 1
        key = tuple(cache_key_of_job(job).values())
        entry = entries.get(key)
        if event.get(Event.CACHE_OUTCOME) == CacheOutcome.WRITTEN:
            if entry is not None and found(entry.get(Cache.UPDATED_AT)) > event[Event.FINALIZED_AT]:
                figures["cache_entries_superseded_by_a_later_worker_write"] += 1
            elif entry is None or entry.get(Cache.UPDATED_AT) != event[Event.FINALIZED_AT]:
                figures["lost_cache_entries"] += 1
            else:
                figures["cache_entries_written"] += 1
                runs = entry.get(Cache.FAILED_RUNS, (entry.get(Cache.DETAILS) or {}).get(Cache.FAILED_RUNS))
                # a crash costs one run; a death the policy counts as a deploy's (zombies planted together die in a
                # wave) costs none
                snapshot = event[Event.POLICY]
                costless = ZombiePolicy(deploy_costs_failed_run=snapshot["deploy_costs_failed_run"]).costless_causes
                if runs != prior_failed_runs.get(job_id, 0) + (cause_of_event(event) not in costless):
                    figures["duplicate_failed_runs_counted"] += 1
        elif event.get(Event.CACHE_OUTCOME) == CacheOutcome.SKIPPED_FRESHER:
            figures["cache_entries_kept_fresher"] += 1
        else:
            figures["lost_cache_entries"] += 1
        if event.get(Event.RETRY_OUTCOME) == RetryOutcome.ENQUEUED:
            retry = jobs.get(event[Event.RETRY_JOB_ID])
            if retry is None:
                figures["lost_retries"] += 1
            else:
                figures["retries_enqueued"] += 1
                retry_ids[job[Job.UNICITY_ID]] += 1
    waiting = Counter(job[Job.UNICITY_ID] for job in jobs.values() if job[Job.STATUS] == Status.WAITING)
    figures["duplicate_retries"] = sum(max(0, waiting[u] - 1) for u in retry_ids)
    figures["events"] = len(events)
    figures["duplicate_events"] = len(events) - len({e[ID] for e in events.values()})
    for name in (
        "lost_zombies_still_started",
        "lost_not_finalized_by_cleanup",
        "lost_event_not_done",
        "lost_cache_entries",
        "lost_retries",
        "duplicate_finished_at_mismatch",
        "duplicate_failed_runs_counted",
    ):
        figures.setdefault(name, 0)
    return dict(figures)


def prior_failed_runs(store: Store, zombie_ids: list[ObjectId]) -> dict[ObjectId, int]:
    """The failed runs each zombie's cache entry counts before the cleanup, as the deployment counts them on a crash."""
    jobs = {job[ID]: job for job in store.jobs.find({ID: {"$in": zombie_ids}})}
    entries = {tuple(entry.get(name) for name in CACHE_KEY): entry for entry in store.cache.find()}
    return {
        job_id: failed_runs_after_crash(entries.get(tuple(cache_key_of_job(job).values())), job) - 1
        for job_id, job in jobs.items()
    }


def assert_nothing_lost_or_doubled(figures: dict[str, int]) -> None:
    bad = {name: value for name, value in figures.items() if name.startswith(("lost_", "duplicate_")) and value}
    assert bad == {}, figures
