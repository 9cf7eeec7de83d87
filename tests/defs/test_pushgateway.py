"""The runs push their figures to a real Pushgateway, and what Prometheus would scrape equals what the databases hold.

Each test starts Debian's ``prometheus-pushgateway`` on 127.0.0.1 and a free port (tests/pushgateway.py) and
stops it by its PID. The cleanup, queue_health and the statistics run through Dagster in process.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from typing import Any

import dagster as dg
import pytest

from tests.helpers import ago, crashed_job, database_resources, run_kill_zombies, step_metadata, text, workload
from tests.pushgateway import running_pushgateway
from zombie_pipeline.defs.health.assets import queue_health
from zombie_pipeline.defs.pushgateway import PUSH_FAILED, PUSH_JOB, MetricsGateway
from zombie_pipeline.defs.resources import ZombiePolicyResource
from zombie_pipeline.defs.statistics.assets import (
    SUGGESTED_T2_METADATA_PREFIX,
    job_duration_statistics,
    job_duration_tallies,
)
from zombie_pipeline.defs.statistics.heartbeat_gaps import heartbeat_gap_tallies
from zombie_pipeline.observability import metrics
from zombie_pipeline.queue.audit_documents import CompensationState, Event, EventState, RetryOutcome
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.reasons import CAUSES, CAUSES_OF_REASON, REASONS
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.statistics.gap_histogram import GapHistogram
from zombie_pipeline.statistics.gap_log import GapBatch, write_batch
from zombie_pipeline.statistics.suggestion_log import latest_suggested_max_durations

URL_ENV = "ZOMBIE_METRICS_TEST_MONGO_URL"
HOOK_ENV = "ZOMBIE_METRICS_TEST_HOOK"
WORKLOAD = workload(finished=100, crashed=6, never_heartbeated=2, overdue=3, running=30, waiting=5, seed=23)
#: Delayed retries (they wait in zombieRetries) and a webhook nothing answers (compensations to try again).
POLICY: dict[str, Any] = {
    "retry_delay_seconds": 600,
    "compensation_webhooks": {"*": HOOK_ENV},
    "compensation_timeout_seconds": 1,
}


@pytest.fixture
def gateway(tmp_path):
    with running_pushgateway(tmp_path) as gateway:
        yield gateway


@pytest.fixture
def resources(store, mongo_url, monkeypatch, gateway):
    monkeypatch.setenv(URL_ENV, mongo_url)
    monkeypatch.setenv(HOOK_ENV, f"http://127.0.0.1:{free_port()}/compensate")  # nothing listens there
    return {
        **database_resources(store, URL_ENV),
        "zombie_policy": ZombiePolicyResource(**POLICY),
        "metrics_gateway": MetricsGateway(gateway=gateway.url),
    }


def group(store: Store, step: str) -> dict[str, str]:
    """The labels of one push's group: the gateway's job label, the queue database, the step."""
    return {"job": PUSH_JOB, "queue_database": store.jobs.database.name, "step": step}


def values(series: dict, *label_names: str) -> dict:
    """``{labels: value}`` keyed by the values of ``label_names`` only (the group's labels are the same for all)."""
    keyed = {}
    for labels, value in series.items():
        labels = dict(labels)
        keyed[tuple(labels[name] for name in label_names) if len(label_names) != 1 else labels[label_names[0]]] = value
    return keyed


def nonzero(keyed: dict) -> dict:
    """What happened, without the zeros pushed for what did not (a series absent is a blank panel, not a zero)."""
    return {key: value for key, value in keyed.items() if value}


def the_value(series: dict) -> float:
    [value] = series.values()
    return value


def test_a_cleanup_and_its_health_check_push_what_the_databases_hold(store, resources, gateway):
    simulate(store, WORKLOAD)
    fresher = crashed_job("user/fresher", "/first-rows")
    store.jobs.insert_one(fresher)
    store.cache.insert_one(cache_document(fresher, ago(60)))  # a result newer than the zombie's start: kept
    store.jobs.insert_many([crashed_job("user/again", job_type) for job_type in ("/splits", "/parquet", "/first-rows")])

    before = time.time()
    result = run_kill_zombies(resources)
    after = time.time()
    assert result.success
    summary = step_metadata(result, "report_cleanup")
    assert summary[PUSH_FAILED] == 0 and step_metadata(result, "find_zombies")[PUSH_FAILED] == 0
    assert dg.materialize([queue_health], resources=resources).success

    cleanup = group(store, "summarize")
    done = list(store.events.find({Event.STATE: EventState.DONE}))
    assert len(done) == summary["finalized"] == 6 + 2 + 3 + 1 + 3
    finalized = Counter((e[Event.JOB][Job.TYPE], e[Event.REASON], e[Event.ERROR_CODE], e[Event.CAUSE]) for e in done)
    zombies = gateway.series(metrics.ZOMBIES_FINALIZED.name, **cleanup)
    pushed = values(zombies, "job_type", "reason", "error_code", "cause")
    assert nonzero(pushed) == finalized
    job_types = {job_type for job_type, *_ in finalized}  # each seen: every reason and its causes, at 0 where none
    assert {(job_type, reason, cause) for job_type, reason, _, cause in pushed} == {
        (t, str(r), str(c)) for t in job_types for r in REASONS for c in CAUSES_OF_REASON[r]
    }
    # the queue keeps finished jobs (2023-01): each finalized zombie is an error job now
    assert store.jobs.count_documents({ID: {"$in": [e[ID] for e in done]}, Job.STATUS: Status.ERROR}) == len(done)
    found = Counter((e[Event.JOB][Job.TYPE], e[Event.REASON]) for e in done)  # no race lost: found = finalized
    found_pushed = values(gateway.series(metrics.ZOMBIES_FOUND.name, **cleanup), "job_type", "reason")
    assert nonzero(found_pushed) == found and len(found_pushed) == len(job_types) * len(REASONS)
    assert the_value(gateway.series(metrics.RACES_LOST.name, **cleanup)) == summary["lost_to_live_worker"] == 0
    fresher_pushed = values(gateway.series(metrics.FRESHER_ENTRIES_KEPT.name, **cleanup), "job_type")
    assert nonzero(fresher_pushed) == {"/first-rows": 1} and set(fresher_pushed) == job_types
    retries = Counter((e[Event.JOB][Job.TYPE], e[Event.CAUSE], e[Event.RETRY_OUTCOME]) for e in done)
    retries_pushed = values(gateway.series(metrics.RETRIES.name, **cleanup), "job_type", "cause", "outcome")
    assert nonzero(retries_pushed) == retries
    assert len(retries_pushed) == len(job_types) * len(CAUSES) * len(RetryOutcome)
    # crashes after the delay, a timeout once its own executor has stopped it, the fresher result not at all
    assert {(cause, outcome) for _, cause, outcome in retries} >= {
        ("crash", "scheduled"),
        ("timeout", "scheduled"),
        ("crash", "not_retried"),
    }
    compensations = values(gateway.series(metrics.COMPENSATION_RUNS.name, **cleanup), "outcome")
    assert compensations == {"done": 0, "to_retry": summary["compensation_to_retry"], "failed": 0}
    assert compensations["to_retry"] == len(done)  # the webhook never answers
    assert before <= the_value(gateway.series(metrics.LAST_SUCCESS.name, **cleanup)) <= after
    assert 0 < the_value(gateway.series(metrics.CLEANUP_DURATION.name, **cleanup)) <= after - before

    brake = group(store, "find_zombies")
    assert the_value(gateway.series(metrics.BRAKE_ENGAGED.name, **brake)) == 0
    started_when_detected = len(done) + 30  # the zombies and the healthy jobs
    assert the_value(gateway.series(metrics.STALE_RATIO.name, **brake)) == pytest.approx(
        len(done) / started_when_detected
    )
    assert the_value(gateway.series(metrics.MAX_STALE_RATIO.name, **brake)) == 0.5

    state = group(store, "queue_health")
    started = Counter(job[Job.TYPE] for job in store.jobs.find({Job.STATUS: Status.STARTED}))
    assert sum(started.values()) == 30
    assert values(gateway.series(metrics.STARTED_JOBS.name, **state), "job_type") == started
    assert the_value(gateway.series(metrics.WAITING_JOBS.name, **state)) == store.jobs.count_documents(
        {Job.STATUS: Status.WAITING}
    )
    assert the_value(gateway.series(metrics.STALE_JOBS.name, **state)) == 0
    assert the_value(gateway.series(metrics.UNFINISHED_FINALIZATIONS.name, **state)) == 0
    scheduled = sum(count for (*_, outcome), count in retries.items() if outcome == "scheduled")
    assert (
        the_value(gateway.series(metrics.RETRIES_WAITING.name, **state))
        == store.retries.count_documents({})
        == scheduled
        > 0
    )
    pending = store.events.count_documents({Event.COMPENSATION_STATE: CompensationState.PENDING})
    assert the_value(gateway.series(metrics.COMPENSATIONS_PENDING.name, **state)) == pending == len(done)
    assert the_value(gateway.series(metrics.COMPENSATIONS_FAILED.name, **state)) == 0
    by_dataset = Counter(e[Event.JOB][Job.DATASET] for e in done)
    assert (
        the_value(gateway.series(metrics.REPEAT_OFFENDERS.name, **state))
        == sum(n >= 3 for n in by_dataset.values())
        == 1
    )
    # every pushed name is declared once, in the module the alert rules and the dashboard are checked against
    samples = {sample.split("{")[0] for sample in gateway.scrape().splitlines() if sample.startswith(metrics.PREFIX)}
    names = {metrics.METRIC_OF_SAMPLE[sample] for sample in samples}
    assert names == {metric.name for metric in metrics.CLEANUP_METRICS + metrics.BRAKE_METRICS + metrics.HEALTH_METRICS}


def test_two_queues_push_to_groups_of_their_own(store, resources, gateway, fresh_database, mongo_url):
    other = Store.of(fresh_database("queue_b"), fresh_database("cache_b"))
    other.ensure_indexes()
    store.jobs.insert_many([crashed_job(f"user/a{i}") for i in range(2)])
    other.jobs.insert_many([crashed_job(f"user/b{i}") for i in range(5)])
    assert run_kill_zombies(resources).success
    assert run_kill_zombies(
        {**resources, **database_resources(other, URL_ENV), "metrics_gateway": resources["metrics_gateway"]}
    ).success

    finalized = gateway.series(metrics.ZOMBIES_FINALIZED.name)
    by_queue: Counter[str] = Counter()
    for labels, value in finalized.items():
        by_queue[dict(labels)["queue_database"]] += value
    assert by_queue == {store.jobs.database.name: 2, other.jobs.database.name: 5}
    assert len(gateway.series(metrics.LAST_SUCCESS.name)) == 2


def test_the_brake_is_pushed_when_it_stops_the_cleanup_and_the_last_success_stays(store, resources, gateway):
    store.jobs.insert_one(crashed_job("user/first"))
    assert run_kill_zombies(resources).success
    cleanup, brake = group(store, "summarize"), group(store, "find_zombies")
    last_success = gateway.series(metrics.LAST_SUCCESS.name, **cleanup)

    store.jobs.insert_many([crashed_job(f"user/dead{i}") for i in range(4)])
    braked = run_kill_zombies({**resources, "zombie_policy": ZombiePolicyResource(**POLICY, min_started_for_brake=1)})

    assert not braked.success
    assert the_value(gateway.series(metrics.BRAKE_ENGAGED.name, **brake)) == 1
    assert the_value(gateway.series(metrics.STALE_RATIO.name, **brake)) == 1.0
    assert gateway.series(metrics.LAST_SUCCESS.name, **cleanup) == last_success  # the alert on it keeps counting


def test_a_cleanup_with_the_gateway_down_succeeds_and_says_so(store, resources, gateway):
    store.jobs.insert_one(crashed_job("user/first"))
    assert run_kill_zombies(resources).success
    gateway.stop()
    store.jobs.insert_many([crashed_job(f"user/later{i}") for i in range(3)])

    result = run_kill_zombies(resources)

    assert result.success
    assert store.events.count_documents({Event.STATE: EventState.DONE}) == 4
    for step in ("find_zombies", "report_cleanup"):
        metadata = step_metadata(result, step)
        assert metadata[PUSH_FAILED] == 1 and metadata["metrics_push"].startswith("failed: ")
    warnings = [
        r.user_message for r in result.logs if r.level == 30 and "metrics not pushed" in r.user_message
    ]  # logging.WARNING
    assert len(warnings) == 2 and all(gateway.url in warning for warning in warnings)


def test_without_a_gateway_nothing_is_pushed_and_the_metadata_says_why(store, resources):
    store.jobs.insert_one(crashed_job())
    result = run_kill_zombies({**resources, "metrics_gateway": MetricsGateway()})
    assert result.success
    assert step_metadata(result, "report_cleanup")["metrics_push"] == "off ($ZOMBIE_PUSHGATEWAY_URL is not set)"
    assert PUSH_FAILED not in step_metadata(result, "report_cleanup")


def test_the_statistics_push_the_suggestions_they_record(store, resources, gateway, tmp_path):
    midnight = utc_now().replace(hour=0, minute=0, second=0, microsecond=0)
    yesterday, day_before = (
        (midnight - dt.timedelta(days=1)).date().isoformat(),
        (midnight - dt.timedelta(days=2)).date().isoformat(),
    )
    simulate(
        store,
        workload(finished=500, crashed=0, never_heartbeated=0, overdue=0, running=0, waiting=0, days=2, seed=7),
        now=midnight,
    )
    policy = ZombiePolicyResource(max_duration_seconds_by_type={"/first-rows": 1800})
    resources = {**resources, "zombie_policy": policy}
    config = {"ops": {job_duration_statistics.op.name: {"config": {"reports_dir": str(tmp_path), "window_days": 2}}}}
    with dg.instance_for_test() as instance:
        for day in (day_before, yesterday):
            assert dg.materialize(
                [job_duration_tallies], partition_key=day, resources=resources, instance=instance
            ).success
        window = dg.materialize(
            [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics], selection=[job_duration_statistics], partition_key=yesterday,
            resources=resources, instance=instance, run_config=config,
        )  # fmt: skip

    [materialization] = window.asset_materializations_for_node(job_duration_statistics.op.name)
    metadata = {key: value.value for key, value in materialization.metadata.items()}
    assert metadata[PUSH_FAILED] == 0
    pushed = group(store, "job_duration_statistics")
    suggested = values(gateway.series(metrics.SUGGESTED_MAX_DURATION.name, **pushed), "job_type")
    recorded = latest_suggested_max_durations(store.suggestions)
    assert suggested == recorded and len(recorded) == 9
    assert {job_type.lstrip("/"): value for job_type, value in suggested.items()} == {
        key[len(SUGGESTED_T2_METADATA_PREFIX) :]: value
        for key, value in metadata.items()
        if key.startswith(SUGGESTED_T2_METADATA_PREFIX)
    }
    configured = values(gateway.series(metrics.CONFIGURED_MAX_DURATION.name, **pushed), "job_type")
    assert configured == {job_type: policy.policy().max_duration_of(job_type) for job_type in configured}
    assert configured["/first-rows"] == 1800 and set(suggested) <= set(configured)
    runs = values(gateway.series(metrics.SUGGESTION_RUNS.name, **pushed), "job_type")
    successes = Counter(
        job[Job.TYPE]
        for job in store.jobs.find(
            {Job.STATUS: Status.SUCCESS, Job.FINISHED_AT: {"$gte": midnight - dt.timedelta(days=2), "$lt": midnight}}
        )
    )
    assert runs == successes
    p99 = values(gateway.series(metrics.SUCCESSFUL_RUN_DURATION.name, quantile="0.99", **pushed), "job_type")
    assert set(p99) == set(successes) and all(suggested[t] >= p99[t] for t in suggested)
    window_end = the_value(gateway.series(metrics.STATISTICS_WINDOW_END.name, **pushed))
    assert window_end == midnight.timestamp()


def test_a_past_window_is_not_pushed(store, resources, gateway, tmp_path):
    config = {"ops": {job_duration_statistics.op.name: {"config": {"reports_dir": str(tmp_path), "window_days": 1}}}}
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics], selection=[job_duration_statistics], partition_key="2024-03-10",
            resources={**resources, "zombie_policy": ZombiePolicyResource(queue_generation="2023-01")}, instance=instance,
            run_config=config,
        )  # fmt: skip
    [materialization] = result.asset_materializations_for_node(job_duration_statistics.op.name)
    assert text(materialization.metadata["metrics_push"]).startswith("not pushed: a past window")
    assert gateway.series(metrics.STATISTICS_WINDOW_END.name) == {}


def test_the_gap_tallies_push_the_gaps_since_the_first_watch_whatever_day_they_hold(store, resources, gateway):
    light, heavy = [58.0, 60.0, 61.0, 75.0, 400.0], [62.0, 130.0]
    earlier, later = GapBatch("earlier"), GapBatch("later")
    earlier.tally("2024-03-09", ("/splits", "light")).gaps = GapHistogram.of(light[:2])
    later.tally("2024-03-10", ("/splits", "light")).gaps = GapHistogram.of(light[2:])
    later.tally("2024-03-10", ("/first-rows", "heavy")).gaps = GapHistogram.of(heavy)
    for batch in (earlier, later):
        write_batch(store.heartbeat_gaps, batch, utc_now())
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [heartbeat_gap_tallies], partition_key="2024-03-09", resources=resources, instance=instance
        )

    [materialization] = result.asset_materializations_for_node(heartbeat_gap_tallies.op.name)
    assert materialization.metadata[PUSH_FAILED].value == 0
    pushed = group(store, "heartbeat_gap_tallies")
    counts = values(gateway.series(metrics.HEARTBEAT_GAP.name + "_count", **pushed), "job_type", "worker_type")
    assert counts == {("/splits", "light"): len(light), ("/first-rows", "heavy"): len(heavy)}  # both days, all time
    buckets = values(gateway.series(metrics.HEARTBEAT_GAP.name + "_bucket", job_type="/splits", **pushed), "le")
    assert buckets == {
        **{f"{bound:g}": sum(gap <= bound for gap in light) for bound in metrics.GAP_BUCKETS},
        "+Inf": len(light),
    }
