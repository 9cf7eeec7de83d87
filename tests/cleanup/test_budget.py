"""Free re-runs have a budget (``cleanup/budget.py``): a (dataset, job type) SIGTERMed alone runs again free three
times within 72 hours, then each lone SIGTERM is charged as the crash it most likely is, towards the quarantine; its
deaths inside a wave stay free. At today's queue (SIGTERM recorded: ``terminated_at``) and the early-2023 one, where
no death alone is free (no SIGTERM is recorded), so only the waves' part applies.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pytest

from tests.cleanup.test_causes import NOW, dead_job, deployment, entry_of
from tests.faults.scenario import counters_off
from tests.helpers import cleanup_at, found, logged_store
from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.budget import spent_budgets
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.messages import (
    DEPLOY_WAVE_MESSAGE,
    quarantine_message,
    terminated_alone_message,
    terminated_too_often_message,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, FreeRuns, Quarantine, RetryOutcome, ZombieEvent
from zombie_pipeline.queue.cache import CACHE_CONTENT_ERROR, Cache
from zombie_pipeline.queue.cache_entries import stored_failed_runs
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Priority, Status
from zombie_pipeline.queue.reasons import Cause, Reason
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import truncate_ms
from zombie_pipeline.queue.worker_type_counts import WorkerSizeMetric, worker_size
from zombie_pipeline.simulation.shapes import job_document

EVICTED = "user/evicted"
TYPE = "/first-rows"
HOUR = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)


def evicted_job(store: Store, generation: str, dates: dict[str, dt.datetime], difficulty: int = 50) -> Any:
    """EVICTED's job started with ``dates``: our waiting re-run of its last death, where there is one; else a new job
    (the backfill's, at ``difficulty``). Its id."""
    rerun = store.jobs.find_one({Job.DATASET: EVICTED, Job.STATUS: Status.WAITING})
    if rerun is not None:
        store.jobs.update_one({ID: rerun[ID]}, {"$set": {Job.STATUS: Status.STARTED, **dates}})
        return rerun[ID]
    job = job_document(TYPE, EVICTED, generation=generation, difficulty=difficulty, **dates)  # type: ignore[arg-type]
    store.jobs.insert_one(job)
    return job[ID]


def die(
    store: Store, policy: ZombiePolicy, generation: str, at: dt.datetime, sigterm: bool = True, difficulty: int = 50
) -> ZombieEvent:
    """EVICTED's job dies alone, SIGTERMed 6 minutes before ``at`` (or its heartbeats stopped 10 minutes before), and
    the cleanup of ``at`` finalizes it: its event."""
    dates = {
        Job.STARTED_AT: truncate_ms(at - 15 * MINUTE),
        Job.LAST_HEARTBEAT: truncate_ms(at - (5 if sigterm else 10) * MINUTE),
        **({Job.TERMINATED_AT: truncate_ms(at - 6 * MINUTE)} if sigterm else {}),
    }
    job_id = evicted_job(store, generation, dates, difficulty)
    cleanup_at(store, policy, at, run_id=f"run-{at:%d%H%M}")
    return found(store.events.find_one({ID: job_id}))


def evicted_waiting(store: Store) -> list[JobDocument]:
    return list(store.jobs.find({Job.DATASET: EVICTED, Job.STATUS: Status.WAITING}))


def message(store: Store) -> str:
    return str(entry_of(store, EVICTED)[Cache.CONTENT][CACHE_CONTENT_ERROR])


def budget_of(event: ZombieEvent) -> tuple[int, int, bool]:
    record = event[Event.FREE_RUNS]
    assert (record[FreeRuns.LIMIT], record[FreeRuns.WINDOW_HOURS]) == (3, 72)
    return record[FreeRuns.ALONE], record[FreeRuns.FREE], record[FreeRuns.CHARGED]


def test_a_pair_sigtermed_alone_four_times_in_72_hours_runs_free_three_times_then_is_charged_then_quarantined(store):
    policy = deployment(store, "2026-05")

    for n in range(3):  # every 12 hours, evicted alone: free, at once, at the same difficulty
        event = die(store, policy, "2026-05", NOW + 12 * n * HOUR)
        assert (event[Event.REASON], event[Event.CAUSE], event[Event.IN_WAVE]) == (
            Reason.TERMINATED,
            Cause.DEPLOY,
            False,
        )
        assert budget_of(event) == (n + 1, n + 1, False)
        assert (event[Event.FAILED_RUNS], event[Event.RETRY_OUTCOME]) == (0, RetryOutcome.ENQUEUED)
        (rerun,) = evicted_waiting(store)
        assert rerun[ID] == event[Event.RETRY_JOB_ID] and rerun[Job.DIFFICULTY] == 50
        assert message(store) == terminated_alone_message(n + 1, 3, 72)

    # the fourth within 72 hours: charged as the crash it most likely is; today's backfill re-runs it (+20 difficulty)
    charged = die(store, policy, "2026-05", NOW + 36 * HOUR)
    assert (charged[Event.REASON], charged[Event.CAUSE]) == (Reason.TERMINATED, Cause.CRASH)
    assert budget_of(charged) == (4, 3, True)
    assert (charged[Event.FAILED_RUNS], charged[Event.RETRY_OUTCOME]) == (1, RetryOutcome.NOT_RETRIED)
    assert stored_failed_runs(entry_of(store, EVICTED)) == 1 and evicted_waiting(store) == []
    assert message(store) == terminated_too_often_message(4, 72)
    details = entry_of(store, EVICTED)[Cache.DETAILS]
    assert details[Event.CAUSE] == Cause.CRASH and details[Event.FREE_RUNS][FreeRuns.CHARGED] is True

    # two more crashes (another lone SIGTERM, charged too; a worker gone silent), the backfill's jobs at +20 each:
    # the third crash in 72 hours quarantines the pair
    again = die(store, policy, "2026-05", NOW + 48 * HOUR, difficulty=70)
    assert (again[Event.CAUSE], budget_of(again)) == (Cause.CRASH, (5, 3, True))
    last = die(store, policy, "2026-05", NOW + 60 * HOUR, sigterm=False, difficulty=90)
    assert (last[Event.REASON], last[Event.CAUSE], last[Event.RETRY_OUTCOME]) == (
        Reason.MISSING_HEARTBEAT,
        Cause.CRASH,
        RetryOutcome.QUARANTINED,
    )
    quarantine = found(store.quarantine.find_one())
    assert quarantine[Quarantine.EVENT_IDS] == [charged[ID], again[ID], last[ID]]
    assert message(store) == quarantine_message(3, 72)
    assert stored_failed_runs(entry_of(store, EVICTED)) == 3  # the deployment's limit: its backfill stops too


def test_a_lone_sigterm_older_than_the_window_no_longer_counts(store):
    policy = deployment(store, "2026-05")
    for hours in (0, 12, 24):
        die(store, policy, "2026-05", NOW + hours * HOUR)
    later = die(store, policy, "2026-05", NOW + 80 * HOUR)  # the first one is past 72 hours: two in the window
    assert (later[Event.CAUSE], budget_of(later)) == (Cause.DEPLOY, (3, 3, False))
    next_one = die(store, policy, "2026-05", NOW + 81 * HOUR)
    assert (next_one[Event.CAUSE], budget_of(next_one)) == (Cause.CRASH, (4, 3, True))


def test_lone_sigterms_of_one_run_are_taken_in_the_order_of_their_sigterms(store):
    policy = deployment(store, "2026-05")
    by_sigterm = {  # made last SIGTERMed first: their ids run the other way
        n: dead_job(
            "2026-05",
            EVICTED,
            NOW - (9 - n) * MINUTE,
            started_at=NOW - 20 * MINUTE,
            terminated_at=NOW - (10 - n) * MINUTE,
            split=f"split-{n}",
        )
        for n in reversed(range(4))
    }
    store.jobs.insert_many(list(by_sigterm.values()))

    counts = cleanup_at(store, policy, NOW).counts

    events = [found(store.events.find_one({ID: by_sigterm[n][ID]})) for n in range(4)]
    assert [budget_of(event) for event in events] == [(1, 1, False), (2, 2, False), (3, 3, False), (4, 3, True)]
    assert (counts["terminated_alone_free"], counts["terminated_alone_charged"]) == (3, 1)


def wave(store: Store, policy: ZombiePolicy, generation: str, at: dt.datetime, sigterm: bool) -> ZombieEvent:
    """Nine other datasets' workers and EVICTED's stop within 9 seconds, 8 minutes before ``at`` (EVICTED's SIGTERMed
    a minute before, where ``sigterm``), and the cleanup of ``at`` finalizes them: EVICTED's event."""
    silent = [truncate_ms(at - 8 * MINUTE + n * dt.timedelta(seconds=1)) for n in range(10)]
    store.jobs.insert_many([dead_job(generation, f"user{n}-{at:%d%H}/data", silent[n]) for n in range(9)])
    dates = {Job.STARTED_AT: silent[9] - 5 * MINUTE, Job.LAST_HEARTBEAT: silent[9]}
    job_id = evicted_job(store, generation, dates | ({Job.TERMINATED_AT: silent[9] - MINUTE} if sigterm else {}))
    cleanup_at(store, policy, at, run_id=f"wave-{at:%d%H}")
    return found(store.events.find_one({ID: job_id}))


def test_the_same_pair_sigtermed_in_a_wave_stays_free_after_its_free_runs_are_spent(store):
    policy = deployment(store, "2026-05")
    for hours in (0, 6, 12, 18):
        die(store, policy, "2026-05", NOW + hours * HOUR)  # three free, the fourth charged

    in_waves = [wave(store, policy, "2026-05", NOW + hours * HOUR, sigterm=True) for hours in (20, 21, 22, 23)]

    assert [(event[Event.CAUSE], event[Event.IN_WAVE]) for event in in_waves] == [(Cause.DEPLOY, True)] * 4
    assert all(Event.FREE_RUNS not in event for event in in_waves)  # nothing spent
    assert [event[Event.RETRY_OUTCOME] for event in in_waves] == [RetryOutcome.ENQUEUED] * 4
    assert {event[Event.FAILED_RUNS] for event in in_waves} == {1}  # the charged one's, kept
    assert message(store) == DEPLOY_WAVE_MESSAGE
    assert store.quarantine.count_documents({}) == 0


@pytest.mark.parametrize("generation", ["2023-01", "2026-05"])
def test_deaths_inside_waves_stay_free_however_many_and_alone_at_2023_they_are_crashes_from_the_first(
    store, generation
):
    """At the early-2023 queue nothing records a SIGTERM, so no death alone is free: there is no budget to spend, and
    a pair dying alone is a crash at once (quarantined at the third); inside waves it is free every time."""
    policy = deployment(store, generation)
    in_waves = [wave(store, policy, generation, NOW + hours * HOUR, sigterm=False) for hours in (0, 6, 12, 18)]
    assert [(event[Event.CAUSE], event[Event.IN_WAVE]) for event in in_waves] == [(Cause.DEPLOY, True)] * 4
    assert [event[Event.RETRY_OUTCOME] for event in in_waves] == [RetryOutcome.ENQUEUED] * 4
    assert {event[Event.FAILED_RUNS] for event in in_waves} == {0}
    assert message(store) == DEPLOY_WAVE_MESSAGE

    alone = [die(store, policy, generation, NOW + hours * HOUR, sigterm=False) for hours in (24, 30, 36)]
    assert [event[Event.CAUSE] for event in alone] == [Cause.CRASH] * 3
    assert [event[Event.FAILED_RUNS] for event in alone] == [1, 2, 3]
    assert alone[-1][Event.RETRY_OUTCOME] == RetryOutcome.QUARANTINED
    assert spent_budgets(store, NOW, NOW + 40 * HOUR) == []


@pytest.mark.parametrize(
    ("settings", "fourth"),
    [({"lone_sigterm_free_reruns": None}, Cause.DEPLOY), ({"lone_sigterm_free_reruns": 0}, Cause.CRASH)],
)
def test_the_budget_is_a_policy_setting_none_frees_every_lone_sigterm_zero_frees_none(store, settings, fourth):
    policy = deployment(store, "2026-05", **settings)
    events = [die(store, policy, "2026-05", NOW + hours * HOUR) for hours in (0, 12, 24, 36)]
    assert events[-1][Event.CAUSE] == fourth
    assert (Event.FREE_RUNS in events[-1]) is (settings["lone_sigterm_free_reruns"] is not None)


def test_where_deploy_deaths_cost_a_failed_run_there_are_no_free_runs_to_budget(store):
    policy = deployment(store, "2026-05", deploy_costs_failed_run=True)
    events = [die(store, policy, "2026-05", NOW + hours * HOUR) for hours in (0, 12, 24, 36)]
    assert {event[Event.CAUSE] for event in events} == {Cause.DEPLOY}
    assert [event[Event.FAILED_RUNS] for event in events] == [1, 2, 3, 4]
    assert all(Event.FREE_RUNS not in event for event in events)


def test_the_pairs_that_spent_their_free_runs_are_listed_with_their_lone_sigterms(store):
    policy = deployment(store, "2026-05")
    for hours in (0, 12, 24, 36, 48):
        die(store, policy, "2026-05", NOW + hours * HOUR)
    assert spent_budgets(store, NOW - HOUR, NOW + 72 * HOUR) == [
        {
            "dataset": EVICTED,
            "type": TYPE,
            "terminated_alone": 5,
            "charged": 2,
            "free_limit": 3,
            "window_hours": 72,
            "last": f"{NOW + 48 * HOUR:%Y-%m-%d %H:%M:%S}",
        }
    ]
    assert spent_budgets(store, NOW - HOUR, NOW + 20 * HOUR) == []  # two free ones only: not spent then


# --- every free run, bounded -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [250, 500])
def test_a_wave_of_500_deploy_deaths_re_enqueues_500_jobs_in_their_order_on_their_worker_sizes_in_bounded_commands(
    store, mongo_url, batch_size
):
    """Bound, at today's queue: 17 commands + 23 per batch (40 for the default batch of 500, 63 for two, measured):
    the wave's re-runs cost one read of their twins, one insert, and the counters' updates (jobTotalMetric, the
    blockages read, workerTypeJobCounts) and the cache's read of the step's version (one per job type) per batch,
    whatever its size. Each re-run keeps its job's priority,
    difficulty (so its worker size) and creation, so the queue serves them in their order, where they were."""
    generation = QUEUE_GENERATIONS["2026-05"]
    policy = deployment(store, generation.name, batch_size=batch_size)
    jobs = [
        dead_job(
            generation.name,
            f"user{n:03}/data",
            NOW - 8 * MINUTE + n * dt.timedelta(milliseconds=60),  # 500 workers silent within 30 s
            created_at=NOW - dt.timedelta(hours=2) + (n * 7919 % 500) * dt.timedelta(seconds=1),  # in no other order
            difficulty=(20, 50, 70, 90)[n % 4],
            priority=(Priority.LOW, Priority.NORMAL, Priority.HIGH)[n % 3],
        )
        for n in range(500)
    ]
    store.jobs.insert_many(jobs)
    counters.write_recount(store, generation)

    with logged_store(mongo_url, store) as (counted, log):
        report = run_cleanup(counted, policy, "wave", now=NOW, override_brake=True)

    assert (report.counts["cause:deploy"], report.counts["retry_enqueued"]) == (500, 500)
    batches = 500 // batch_size
    assert len(log.names) <= 17 + 23 * batches, " ".join(log.names)
    inserted = [len(command["documents"]) for command in log.commands if command.get("insert") == store.jobs.name]
    assert inserted == [batch_size] * batches  # the re-runs: one insert per batch
    served = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}  # the deployment's order: priority, then creation

    def in_queue_order(found: list[JobDocument]) -> list[tuple[str, str, int, dt.datetime]]:
        ordered = sorted(found, key=lambda job: (served[Priority(job[Job.PRIORITY])], job[Job.CREATED_AT]))
        return [(job[Job.DATASET], job[Job.PRIORITY], job[Job.DIFFICULTY], job[Job.CREATED_AT]) for job in ordered]

    reruns = list(store.jobs.find({Job.STATUS: Status.WAITING}))
    assert in_queue_order(reruns) == in_queue_order(jobs)
    sizes = {
        row[WorkerSizeMetric.WORKER_SIZE]: row[WorkerSizeMetric.JOBS_COUNT] for row in store.worker_size_metrics.find()
    }
    assert (
        sizes
        == Counter(worker_size(job[Job.DIFFICULTY]) for job in jobs)
        == {"light": 125, "medium": 250, "heavy": 125}
    )
    assert counters_off(store, generation) == dict.fromkeys(counters_off(store, generation), 0)
