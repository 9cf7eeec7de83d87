"""The watcher in Dagster: a watch run finalizing at the deadlines, the sensor keeping one running, the fallback."""

import datetime as dt
import itertools
import threading

import dagster as dg

from tests.helpers import (
    QUIET_LOGGERS,
    crashed_job,
    healthy_job,
    job_document,
    step_metadata,
)
from zombie_pipeline.cleanup import watch_lease
from zombie_pipeline.defs.cleanup.sensors import stale_jobs_sensor
from zombie_pipeline.defs.resources import ZombiePolicyResource
from zombie_pipeline.defs.tags import WATCHED_QUEUE_DATABASE_TAG
from zombie_pipeline.defs.watch.jobs import HANDOFF_SECONDS, zombie_watch_job
from zombie_pipeline.defs.watch.sensors import (
    RELAUNCH_BACKOFF_SECONDS,
    WATCH_START_GRACE_SECONDS,
    WatchRun,
    relaunch_verdict,
    zombie_watch_sensor,
)
from zombie_pipeline.queue.audit_documents import Event, WatchState
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.queue.worker_type_counts import worker_size
from zombie_pipeline.simulation import shapes
from zombie_pipeline.statistics.gap_histogram import GapHistogram
from zombie_pipeline.statistics.gap_log import read_totals

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
STARTED, QUEUED = dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.QUEUED


def tick(sensor, instance, resources):
    return sensor.evaluate_tick(
        dg.build_sensor_context(instance=instance, resources=resources, sensor_name=sensor.name)
    )


def ago(seconds: float) -> dt.datetime:
    return utc_now() - dt.timedelta(seconds=seconds)


# --- the watch run ----------------------------------------------------------------------------------------------


def test_a_watch_run_finalizes_each_job_at_its_deadline_and_logs_and_summarizes_it(store, resources, instance):
    dead = crashed_job("user/dead")
    dying = job_document(dataset="user/dying", started_at=ago(400), last_heartbeat=ago(297))  # due in 3 s
    store.jobs.insert_many([dead, dying, *(healthy_job(f"user/healthy-{n}") for n in range(5))])

    result = zombie_watch_job.execute_in_process(
        run_config={"ops": {"watch_deadlines": {"config": {"run_minutes": 0.12}}}, "loggers": QUIET_LOGGERS},
        resources=resources,
        instance=instance,
    )

    assert result.success
    events = {event[ID]: event for event in store.events.find()}
    assert set(events) == {dead[ID], dying[ID]}
    assert {event[Event.RUN_ID] for event in events.values()} == {result.run_id}
    assert 0 < events[dying[ID]][Event.RELEASE_LAG_SECONDS] < 2
    metadata = step_metadata(result, "watch_deadlines")
    assert metadata["finalized"] == 2
    assert metadata["release_lag_max_seconds"] >= events[dying[ID]][Event.RELEASE_LAG_SECONDS]
    assert "finalized 2 zombies" in metadata["summary"]
    assert "a successor takes over" in metadata["ended_because"]
    logged = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert sum("released /splits user/dying" in line for line in logged) == 1
    lease = watch_lease.read(store.watchers)
    assert lease is not None and lease.holder == result.run_id and lease.state == WatchState.ENDED


def test_a_watch_run_turned_off_by_the_policy_ends_at_once_without_acting(store, resources, instance):
    store.jobs.insert_one(crashed_job())
    resources = {**resources, "zombie_policy": ZombiePolicyResource(watch_deadlines=False)}

    result = zombie_watch_job.execute_in_process(resources=resources, instance=instance)

    assert result.success and store.events.count_documents({}) == 0
    assert "watch_deadlines: false" in step_metadata(result, "watch_deadlines")["ended_because"]


def test_the_watch_job_holds_no_cleanup_back_and_is_never_retried_by_dagster():
    assert WATCHED_QUEUE_DATABASE_TAG in zombie_watch_job.tags
    assert "zombie_pipeline/queue_database" not in zombie_watch_job.tags  # the cleanups' one-at-a-time limit
    assert "dagster/max_retries" not in zombie_watch_job.tags
    assert int(zombie_watch_job.tags["dagster/max_runtime"]) > 3600 + HANDOFF_SECONDS


# --- the sensor that keeps one running ---------------------------------------------------------------------------


def lease(until: float, ends_in: float | None = 3000, state: str = WatchState.WATCHING) -> watch_lease.LeaseView:
    return watch_lease.LeaseView(
        holder="holder",
        lease_until=NOW + dt.timedelta(seconds=until),
        renewed_at=NOW,
        ends_at=NOW + dt.timedelta(seconds=ends_in) if ends_in is not None else None,
        state=state,
        watched=10,
        next_deadline=None,
        finalized=0,
    )


def verdict(lease_view, *runs: WatchRun, failures: int = 0, failed_ago: float = 0) -> str | None:
    last_failure = NOW.timestamp() - failed_ago if failures else None
    return relaunch_verdict(lease_view, runs, failures, last_failure, NOW, start_timeout=360)


def run(status: dg.DagsterRunStatus, since_ago: float, run_id: str = "other") -> WatchRun:
    return WatchRun(run_id, status, NOW.timestamp() - since_ago)


def test_a_watch_run_is_asked_for_when_no_watch_ever_held_the_lease_or_its_lease_lapsed_or_ended():
    assert verdict(None) is None
    assert verdict(lease(until=-1)) is None  # died or hung: not heard of for a lease
    assert verdict(lease(until=10, state=WatchState.ENDED)) is None


def test_no_watch_run_is_asked_for_while_one_watches_far_from_its_end():
    why = verdict(lease(until=10), run(STARTED, 600, run_id="holder"))
    assert why is not None and "watch run holder is watching" in why


def test_the_successor_is_asked_for_before_the_end_and_only_once():
    assert verdict(lease(until=10, ends_in=HANDOFF_SECONDS - 1), run(STARTED, 3000, run_id="holder")) is None
    waiting = verdict(lease(until=10, ends_in=100), run(STARTED, 3000, run_id="holder"), run(STARTED, 3000))
    queued = verdict(lease(until=10, ends_in=100), run(QUEUED, 30))
    assert waiting is not None and "at the handover" in waiting
    assert queued is not None and "queued" in queued


def test_a_started_run_that_renews_no_lease_is_taken_for_dead_once_its_start_grace_is_over():
    assert verdict(lease(until=-30), run(STARTED, WATCH_START_GRACE_SECONDS + 1, run_id="holder")) is None  # hung
    starting = verdict(lease(until=-30), run(STARTED, 10))
    assert starting is not None and "takes the lease soon" in starting
    assert verdict(None, run(QUEUED, 400)) is None  # past the instance's start timeout: its launch failed


def test_after_failed_watch_runs_the_sensor_waits_longer_each_time():
    assert verdict(None, failures=1, failed_ago=0) is None  # a single death: at once
    why = verdict(None, failures=2, failed_ago=30)
    assert why is not None and "failed" in why
    assert verdict(None, failures=2, failed_ago=RELAUNCH_BACKOFF_SECONDS[1]) is None
    assert verdict(None, failures=9, failed_ago=RELAUNCH_BACKOFF_SECONDS[-1] - 1) is not None


def test_the_sensor_asks_for_a_watch_run_when_none_watches_and_for_none_while_one_does(store, resources, instance):
    [request] = tick(zombie_watch_sensor, instance, resources).run_requests
    assert request.tags["zombie_pipeline/trigger"] == "zombie_watch_sensor"

    now = utc_now()
    assert watch_lease.acquire(store.watchers, "watch-1", now, 15, now + dt.timedelta(hours=1))
    result = tick(zombie_watch_sensor, instance, resources)
    assert result.run_requests == [] and "watch run watch-1 is watching" in result.skip_message


def test_the_sensor_asks_for_none_when_the_policy_turns_the_watcher_off(resources, instance):
    resources = {**resources, "zombie_policy": ZombiePolicyResource(watch_deadlines=False)}
    result = tick(zombie_watch_sensor, instance, resources)
    assert result.run_requests == [] and "watch_deadlines: false" in result.skip_message


# --- the fallback -------------------------------------------------------------------------------------------------


def test_stale_jobs_sensor_leaves_stale_jobs_to_a_live_watcher_and_takes_over_once_its_lease_lapsed(
    store, resources, instance
):
    store.jobs.insert_many([crashed_job("user/a"), healthy_job()])
    now = utc_now()
    assert watch_lease.acquire(store.watchers, "watch-1", now, 2, now + dt.timedelta(hours=1))
    sensor_resources = {k: v for k, v in resources.items() if k != "metrics_gateway"}

    left = tick(stale_jobs_sensor, instance, sensor_resources)
    assert left.run_requests == [] and "left to the watcher" in left.skip_message

    store.watchers.update_one({ID: "watcher"}, {"$set": {"lease_until": now - dt.timedelta(seconds=1)}})  # it died
    [request] = tick(stale_jobs_sensor, instance, sensor_resources).run_requests
    assert request.tags["zombie_pipeline/stale_jobs"] == "1"
    assert store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 2


def test_a_watch_run_records_the_heartbeat_gaps_it_saw_in_the_gap_log(store, resources, instance):
    """The gap observer rides every watch run: a job beating every 2.5 s while the watch reads the jobs every 2 s
    leaves its gaps in the gap log, under its type and worker size, each one a gap it really had; a job the watch
    finalized leaves none."""
    era = "2023-07"  # the first to record a job's difficulty: its worker size
    beats = [milliseconds(ago(1))]  # as the database keeps them
    beating = shapes.job_document(dataset="user/beating", generation=era, difficulty=80, started_at=ago(120),
                                  last_heartbeat=beats[0])  # fmt: skip
    dead = shapes.job_document(dataset="user/dead", generation=era, difficulty=80, started_at=ago(900),
                               last_heartbeat=ago(800))  # fmt: skip
    store.jobs.insert_many([beating, dead])
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(2.5):
            beats.append(milliseconds(utc_now()))
            store.jobs.update_one({ID: beating[ID]}, {"$set": {Job.LAST_HEARTBEAT: beats[-1]}})

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        result = zombie_watch_job.execute_in_process(
            run_config={"ops": {"watch_deadlines": {"config": {"run_minutes": 0.15}}}, "loggers": QUIET_LOGGERS},
            resources={**resources, "zombie_policy": ZombiePolicyResource(queue_generation=era)},
            instance=instance,
        )
    finally:
        stop.set()
        beater.join(timeout=10)

    assert result.success
    logged = read_totals(store.heartbeat_gaps)
    key = (beating[Job.TYPE], worker_size(80))
    assert set(logged.tallies) == {key}
    tally = logged.tallies[key]
    truth = GapHistogram.of((later - earlier).total_seconds() for earlier, later in itertools.pairwise(beats))
    assert tally.gaps.count >= 2  # some 3 beats in the run's 9 s, each seen by a refresh
    assert all(count <= truth.counts.get(bucket, 0) for bucket, count in tally.gaps.counts.items()), (tally, truth)
    assert tally.finalized == 1 and tally.unobserved == 0  # the dead job, finalized by the watch


def milliseconds(moment: dt.datetime) -> dt.datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)
