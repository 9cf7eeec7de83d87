"""Detection: which started jobs are zombies, and why, decided in MongoDB."""

import datetime as dt

import pytest

from tests.helpers import job_document, workload
from zombie_pipeline.cleanup.detection import (
    count_stale,
    detect,
    explain_stale,
    known_job_types,
    stale_filter,
)
from zombie_pipeline.policy import PolicyError, ZombiePolicy
from zombie_pipeline.queue.generations import NEWEST_QUEUE_GENERATION
from zombie_pipeline.queue.jobs import Job, JobDocument, Status
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.simulation.simulator import simulate

POLICY = ZombiePolicy(heartbeat_timeout_seconds=300, max_duration_seconds=1200)
MS = dt.timedelta(milliseconds=1)


def seconds(n: float) -> dt.timedelta:
    return dt.timedelta(seconds=n)


def reasons(store, policy=POLICY, now=None, job_types=None) -> dict[str, str]:
    detection = detect(store.jobs, policy, now or utc_now(), job_types)
    return {candidate.job[Job.DATASET]: candidate.reason for candidate in detection.candidates}


@pytest.fixture
def now():
    return utc_now()


def test_a_heartbeat_older_than_the_timeout_is_a_missing_heartbeat(store, now):
    store.jobs.insert_many(
        [
            job_document(dataset="u/dead", started_at=now - seconds(900), last_heartbeat=now - seconds(300) - MS),
            job_document(dataset="u/alive", started_at=now - seconds(900), last_heartbeat=now - seconds(300)),
        ]
    )
    assert reasons(store, now=now) == {"u/dead": Reason.MISSING_HEARTBEAT}
    assert count_stale(store.jobs, POLICY, now) == 1


def test_a_job_that_never_heartbeated_is_judged_by_its_start(store, now):
    store.jobs.insert_many(
        [
            job_document(dataset="u/missing-field", started_at=now - seconds(300) - MS),
            job_document(dataset="u/null-field", started_at=now - seconds(301), last_heartbeat=None)
            | {Job.LAST_HEARTBEAT: None},
            job_document(dataset="u/just-started", started_at=now - seconds(300)),
        ]
    )
    assert reasons(store, now=now) == {
        "u/missing-field": Reason.NEVER_HEARTBEATED,
        "u/null-field": Reason.NEVER_HEARTBEATED,
    }
    # the query agrees, though the SIGTERM rule's shorter window (120 s) widens the index range it scans
    assert POLICY.termination_grace_seconds is not None and count_stale(store.jobs, POLICY, now) == 2


def test_a_live_job_past_its_maximum_duration_is_exceeded(store, now):
    store.jobs.insert_many(
        [
            job_document(dataset="u/over", started_at=now - seconds(1200) - MS, last_heartbeat=now - seconds(5)),
            job_document(dataset="u/at-limit", started_at=now - seconds(1200), last_heartbeat=now - seconds(5)),
        ]
    )
    assert reasons(store, now=now) == {"u/over": Reason.EXCEEDED_MAX_DURATION}


def test_a_dead_job_past_its_maximum_duration_is_a_crash_that_records_it_was_past_t2(store, now):
    store.jobs.insert_many(
        [
            job_document(dataset="u/over-and-dead", started_at=now - seconds(5000), last_heartbeat=now - seconds(4000)),
            job_document(dataset="u/over-never-beat", started_at=now - seconds(5000)),
            job_document(dataset="u/dead-young", started_at=now - seconds(900), last_heartbeat=now - seconds(800)),
        ]
    )
    found = {
        c.job[Job.DATASET]: (c.reason, c.threshold_seconds, c.past_max_duration)
        for c in detect(store.jobs, POLICY, now).candidates
    }
    assert found == {
        "u/over-and-dead": (Reason.MISSING_HEARTBEAT, 300, True),
        "u/over-never-beat": (Reason.NEVER_HEARTBEATED, 300, True),
        "u/dead-young": (Reason.MISSING_HEARTBEAT, 300, False),
    }


def test_a_job_sigtermed_long_ago_is_terminated_and_one_sigtermed_recently_is_left_whatever_its_age(store, now):
    store.jobs.insert_many(
        [
            job_document(
                dataset="u/term-old",
                generation=NEWEST_QUEUE_GENERATION,
                started_at=now - seconds(5000),
                last_heartbeat=now - seconds(10),
                terminated_at=now - seconds(301),
            ),
            job_document(
                dataset="u/term-recent-past-t2",
                generation=NEWEST_QUEUE_GENERATION,
                started_at=now - seconds(5000),
                last_heartbeat=now - seconds(900),
                terminated_at=now - seconds(60),
            ),
            job_document(
                dataset="u/term-recent",
                generation=NEWEST_QUEUE_GENERATION,
                started_at=now - seconds(600),
                last_heartbeat=now - seconds(10),
                terminated_at=now - seconds(60),
            ),
        ]
    )
    assert reasons(store, now=now) == {"u/term-old": Reason.TERMINATED}
    assert count_stale(store.jobs, POLICY, now) == 1  # the query and the reason agree


def test_a_job_sigtermed_past_its_grace_period_and_silent_since_is_dead_before_the_heartbeat_timeout(store, now):
    """The pod is killed once its grace period is over; heartbeats go on until then, so two missed ones say it was."""
    policy = POLICY.model_copy(update={"termination_grace_seconds": 120})  # 2 missed heartbeats of 60 s: 120 s silent

    def sigtermed(dataset: str, started: float, terminated: float, beat: float | None = None) -> JobDocument:
        """A job started, SIGTERMed and last heartbeated these many seconds ago."""
        last_heartbeat = None if beat is None else now - seconds(beat)
        return job_document(
            dataset=dataset,
            generation=NEWEST_QUEUE_GENERATION,
            started_at=now - seconds(started),
            terminated_at=now - seconds(terminated),
            last_heartbeat=last_heartbeat,
        )

    store.jobs.insert_many(
        [
            sigtermed("u/killed", started=200, terminated=130, beat=121),
            sigtermed("u/never-beat", started=140, terminated=130),
            sigtermed("u/beating-past-grace", started=900, terminated=200, beat=30),
            sigtermed("u/in-grace", started=900, terminated=100, beat=150),
        ]
    )

    found = {c.job[Job.DATASET]: (c.reason, c.threshold_seconds) for c in detect(store.jobs, policy, now).candidates}
    assert found == {"u/killed": (Reason.TERMINATED, 120), "u/never-beat": (Reason.TERMINATED, 120)}
    assert count_stale(store.jobs, policy, now) == 2  # the query and the reason agree
    as_the_deployment = policy.model_copy(update={"termination_grace_seconds": None})
    assert reasons(store, as_the_deployment, now=now) == {}  # only 300 s after the SIGTERM
    assert reasons(store, as_the_deployment, now=now + seconds(171)) == {
        "u/killed": Reason.TERMINATED,
        "u/never-beat": Reason.TERMINATED,
        "u/beating-past-grace": Reason.TERMINATED,
    }


def test_detection_time_runs_from_the_last_sign_of_life_and_for_a_running_job_from_its_deadline(store, now):
    store.jobs.insert_many(
        [
            job_document(dataset="u/dead", started_at=now - seconds(900), last_heartbeat=now - seconds(400)),
            job_document(dataset="u/never-beat", started_at=now - seconds(350)),
            job_document(
                dataset="u/sigterm",
                generation=NEWEST_QUEUE_GENERATION,
                started_at=now - seconds(900),
                last_heartbeat=now - seconds(320),
                terminated_at=now - seconds(330),
            ),
            job_document(dataset="u/overdue", started_at=now - seconds(1300), last_heartbeat=now - seconds(5)),
        ]
    )
    finalized_at = now + seconds(7)

    late = {c.job[Job.DATASET]: c.detection_seconds(finalized_at) for c in detect(store.jobs, POLICY, now).candidates}
    assert late == {"u/dead": 407, "u/never-beat": 357, "u/sigterm": 327, "u/overdue": 107}


def test_each_type_is_held_to_its_own_maximum_duration(store, now):
    policy = ZombiePolicy(max_duration_seconds=1200, max_duration_seconds_by_type={"/slow": 7200, "/fast": 400})
    store.jobs.insert_many(
        [
            job_document("/slow", "u/slow-ok", started_at=now - seconds(3600), last_heartbeat=now),
            job_document("/slow", "u/slow-over", started_at=now - seconds(7201), last_heartbeat=now),
            job_document("/fast", "u/fast-over", started_at=now - seconds(401), last_heartbeat=now),
            job_document("/other", "u/default-over", started_at=now - seconds(1201), last_heartbeat=now),
            job_document("/other", "u/default-ok", started_at=now - seconds(1100), last_heartbeat=now),
        ]
    )
    found = detect(store.jobs, policy, now)
    assert {c.job[Job.DATASET]: (c.reason, c.threshold_seconds) for c in found.candidates} == {
        "u/slow-over": (Reason.EXCEEDED_MAX_DURATION, 7200),
        "u/fast-over": (Reason.EXCEEDED_MAX_DURATION, 400),
        "u/default-over": (Reason.EXCEEDED_MAX_DURATION, 1200),
    }


def test_only_started_jobs_are_considered(store, now):
    long_ago = now - seconds(10_000)
    store.jobs.insert_many(
        [
            job_document(dataset=f"u/{status}", status=status, started_at=long_ago, finished_at=long_ago + seconds(5))
            for status in (Status.SUCCESS, Status.ERROR, Status.CANCELLED)
        ]
        + [job_document(dataset="u/waiting", status=Status.WAITING, created_at=long_ago)]
    )
    assert reasons(store, now=now) == {}


def test_detection_can_be_limited_to_some_job_types(store, now):
    old = now - seconds(5000)
    store.jobs.insert_many(
        [job_document(job_type, f"u{i}/d", started_at=old) for i, job_type in enumerate(["/a", "/b", "/c"])]
    )
    assert set(reasons(store, now=now, job_types=["/a", "/c"])) == {"u0/d", "u2/d"}


def test_the_simulated_queue_is_classified_as_the_simulator_built_it(store):
    simulation = simulate(store, workload(finished=300, seed=3))
    found = detect(store.jobs, ZombiePolicy(), simulation.now)
    by_reason = {reason: {c.id for c in found.candidates if c.reason == reason} for reason in Reason}
    assert by_reason[Reason.MISSING_HEARTBEAT] == set(simulation.crashed_ids)
    assert by_reason[Reason.NEVER_HEARTBEATED] == set(simulation.never_heartbeated_ids)
    assert by_reason[Reason.EXCEEDED_MAX_DURATION] == set(simulation.overdue_ids)


def test_the_query_walks_the_started_at_index_and_never_finished_history(store, now):
    store.jobs.insert_many(
        [
            job_document(
                dataset=f"u/old-{i}",
                status=Status.SUCCESS,
                started_at=now - seconds(9000),
                finished_at=now - seconds(8000),
            )
            for i in range(300)
        ]
        + [job_document(dataset="u/zombie", started_at=now - seconds(900), last_heartbeat=now - seconds(800))]
    )
    explain = explain_stale(store.jobs, POLICY, now)
    stats = explain["executionStats"]
    assert stats["nReturned"] == 1
    assert stats["totalDocsExamined"] <= 1  # not one of the 300 finished jobs
    assert "zombie_pipeline_status_started_at" in str(explain["queryPlanner"]["winningPlan"])
    assert count_stale(store.jobs, POLICY, now) == 1


def test_a_crafted_type_name_is_only_ever_a_value(store, now):
    store.jobs.insert_one(job_document("/a", "u/victim", started_at=now - seconds(5000)))
    hostile = {"$ne": "x"}
    query = stale_filter(POLICY, now, job_types=["$ne", "/b"])
    assert store.jobs.count_documents(query) == 0
    for not_a_type in ("", "$where"):  # no job of such a type is ever judged: no override may name one
        with pytest.raises(PolicyError):
            ZombiePolicy(max_duration_seconds_by_type={not_a_type: 2000})
    # a type named like an operator is a key of our config, never a key of the query
    policy = ZombiePolicy(max_duration_seconds_by_type={'{"$gt": ""}': 2000, str(hostile): 2000})
    assert store.jobs.count_documents(stale_filter(policy, now)) == 1


def test_the_deployments_job_types_are_those_of_its_jobs_and_of_its_cache_entries(store):
    """Where finished jobs are deleted, a step whose jobs all finished is known by its cache entries."""
    store.jobs.insert_many([job_document("/first-rows", "u/a"), job_document("/splits", "u/b", status=Status.WAITING)])
    store.cache.insert_one(cache_document(job_document("/config-names", "u/c"), utc_now()))

    assert known_job_types(store.jobs, store.cache) == {"/first-rows", "/splits", "/config-names"}
