"""The pipeline's own process SIGKILLed at random points, again and again: a clean run then ends in the very
state of a run never interrupted, and no zombie is finalized twice.

On a server of the test's own, which keeps running: the cleanup dies
(``tests/faults/actors/cleanup_actor.py``), and what a process killed in a transaction leaves on the
server stays on that server.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bson import ObjectId

from tests.faults.scenario import (
    FULL,
    audit,
    comparable_state,
    connect,
    faults_store,
    prior_failed_runs,
    start_actor,
)
from tests.figures import report_figures
from tests.helpers import found, workload
from tests.servers import LocalServer
from zombie_pipeline.cleanup.detection import detect
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState
from zombie_pipeline.queue.cache import CACHE_KEY
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.simulation.simulator import simulate

KILL_WORKLOAD = (
    workload(finished=80, crashed=50, never_heartbeated=8, overdue=8, running=20, waiting=10, seed=23)
    if FULL
    else workload(finished=60, crashed=35, never_heartbeated=5, overdue=5, running=15, waiting=10, seed=23)
)
KILL_POLICY: dict[str, Any] = {"batch_size": 3, "claim_lease_seconds": 0}
OPERATION_TIMEOUT_MS = 60_000
KILLS = 20 if FULL else 6


def _add_fresher_entries(store: Store, job_ids: list[ObjectId]) -> None:
    for job in store.jobs.find({ID: {"$in": job_ids}}):
        entry = cache_document(job, job[Job.STARTED_AT] + dt.timedelta(seconds=45))
        store.cache.replace_one({name: entry.get(name) for name in CACHE_KEY}, entry, upsert=True)


def test_sigkilled_cleanups_then_a_clean_run_end_in_the_state_of_an_uninterrupted_run(
    server: LocalServer, tmp_path: Path
):
    # one operation blocked for a minute is a wedged server: the test fails saying so rather than waiting forever
    client = connect(server.url, timeoutMS=OPERATION_TIMEOUT_MS)
    sim_now = utc_now()
    reference = faults_store(client, "ref_queue", "ref_cache")
    killed = faults_store(client, "kill_queue", "kill_cache")
    for store in (reference, killed):
        store.ensure_indexes()
        simulation = simulate(store, KILL_WORKLOAD, now=sim_now)
        _add_fresher_entries(store, simulation.zombie_ids[:4])
    zombies = simulation.zombie_ids
    original_ids = {job[ID] for job in killed.jobs.find({}, {ID: 1})}
    prior = prior_failed_runs(killed, zombies)
    policy = ZombiePolicy(**KILL_POLICY)
    clean_now = sim_now + dt.timedelta(seconds=1)
    # the kills run at sim_now + i ms: the same zombies are due at every instant used
    assert (
        {c.id for c in detect(killed.jobs, policy, sim_now).candidates}
        == {c.id for c in detect(killed.jobs, policy, clean_now).candidates}
        == set(zombies)
    )

    started = time.monotonic()
    run_cleanup(reference, policy, "uninterrupted", now=clean_now, override_brake=True)
    reference_seconds = time.monotonic() - started

    rng = random.Random(int(os.environ.get("ZOMBIE_FAULTS_SEED", "7")))
    outcomes: dict[str, Any] = Counter()  # counts, and a line per kill
    delays = []
    for i in range(KILLS):
        process = start_actor(
            "cleanup_actor",
            tmp_path,
            {
                "url": server.url,
                "queue": "kill_queue",
                "cache": "kill_cache",
                "policy": KILL_POLICY,
                "run_id": f"killed-{i}",
                "now": (sim_now + dt.timedelta(milliseconds=i)).isoformat(),
            },
        )
        assert found(process.stdout).readline().strip() == "started", found(process.stderr).read()
        # together the delays add up to about 1.5 uninterrupted runs: every step gets killed somewhere
        delay = rng.uniform(0.0, 3 * reference_seconds / KILLS)
        delays.append(round(delay, 2))
        try:
            process.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
        out, err = process.communicate(timeout=60)
        if process.returncode == -signal.SIGKILL:
            outcomes["killed_mid_run"] += 1
        else:
            assert process.returncode == 0, err[-3000:]
            outcomes["completed_before_kill"] += 1
        states = Counter(e[Event.STATE] for e in killed.events.find({}, {Event.STATE: 1}))
        outcomes[f"events_after_kill_{i}"] = "/".join(
            f"{states[state]}{state[0]}" for state in (EventState.CLAIMED, EventState.DONE)
        )
    at_last_kill = dict(Counter(e[Event.STATE] for e in killed.events.find({}, {Event.STATE: 1})))
    finalized_before_clean = {
        j[ID]: j[Job.FINISHED_AT] for j in killed.jobs.find({ID: {"$in": zombies}, Job.STATUS: Status.ERROR})
    }

    clean = run_cleanup(killed, policy, "clean", now=clean_now, override_brake=True)

    expected, actual = comparable_state(reference, original_ids), comparable_state(killed, original_ids)
    differences = {part: _diff_count(expected[part], actual[part]) for part in expected}
    refinalized = sum(
        1
        for job in killed.jobs.find({ID: {"$in": list(finalized_before_clean)}})
        if job[Job.FINISHED_AT] != finalized_before_clean[job[ID]]
    )
    figures = audit(killed, zombies, prior)
    report_figures(
        "sigkill_repeated",
        {
            "zombies": len(zombies),
            "batch_size": KILL_POLICY["batch_size"],
            "uninterrupted_run_seconds": round(reference_seconds, 1),
            "sigkills": KILLS,
            "killed_mid_run": outcomes["killed_mid_run"],
            "completed_before_kill": outcomes["completed_before_kill"],
            "kill_delays_seconds": delays,
            "events_claimed/finalized/done_after_each_kill": [outcomes[f"events_after_kill_{i}"] for i in range(KILLS)],
            "events_by_state_at_last_kill": at_last_kill,
            "clean_run_taken_over": clean.reconciled.counts["taken_over"],
            "clean_run_finalized_new": clean.counts["finalized"],
            "jobs_compared": len(actual["jobs"]),
            "cache_entries_compared": len(actual["cache"]),
            "events_compared": len(actual["events"]),
            "retries_compared": len(actual["retries"]),
            "differences_from_uninterrupted": differences,
            "refinalized_after_kill": refinalized,
            **{k: v for k, v in figures.items() if k.startswith(("lost_", "duplicate_", "retries", "events"))},
        },
    )
    assert outcomes["killed_mid_run"] >= 1
    assert differences == {"jobs": 0, "retries": 0, "cache": 0, "events": 0}, differences
    assert expected == actual
    assert refinalized == 0
    assert len(actual["events"]) == len(zombies)
    assert figures["duplicate_retries"] == 0


def _diff_count(expected: Any, actual: Any) -> int:
    if isinstance(expected, dict):
        keys = set(expected) | set(actual)
        return sum(1 for key in keys if expected.get(key) != actual.get(key))
    return sum(1 for a, b in zip(expected, actual) if a != b) + abs(len(expected) - len(actual))
