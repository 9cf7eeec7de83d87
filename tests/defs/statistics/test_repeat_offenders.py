"""The repeat_offenders asset and its check, materialized in process against the test server."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, cast

import dagster as dg
import pydantic
import pytest
from bson import ObjectId

from tests.helpers import QUEUE_GENERATION, database_resources, text
from zombie_pipeline.defs.health.assets import queue_health
from zombie_pipeline.defs.resources import (
    Databases,
    ZombiePolicyResource,
)
from zombie_pipeline.defs.statistics.assets import (
    DAILY_PARTITIONS,
    GROUP,
    duration_statistics_job,
    job_duration_statistics,
    job_duration_tallies,
)
from zombie_pipeline.defs.statistics.heartbeat_gaps import heartbeat_gap_tallies
from zombie_pipeline.defs.statistics.repeat_offenders import CHECK_NAME, repeat_offenders
from zombie_pipeline.queue.audit_documents import Event, EventState, RetryOutcome, ZombieEvent
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.reasons import ERROR_CODE_OF_REASON, Reason
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now

URL_ENV = "ZOMBIE_OFFENDERS_TEST_MONGO_URL"
UTC = dt.UTC
DAY = "2024-03-10"  # the partition: with the default 7 days, the window is 2024-03-04 to 2024-03-11


def at(day: int, hour: int = 12) -> dt.datetime:
    return dt.datetime(2024, 3, day, hour, tzinfo=UTC)


def event(dataset, job_type: str, reason: Reason, finalized_at: dt.datetime, **fields: Any) -> ZombieEvent:
    return cast(
        ZombieEvent,
        {
            ID: ObjectId(),
            Event.JOB: {Job.TYPE: job_type, Job.DATASET: dataset},
            Event.REASON: reason,
            Event.ERROR_CODE: ERROR_CODE_OF_REASON.get(reason),
            Event.FINALIZED_AT: finalized_at,
            Event.STATE: EventState.DONE,
            Event.RETRY_OUTCOME: RetryOutcome.ENQUEUED,
            **fields,
        },
    )


@pytest.fixture
def resources(mongo_url, store, monkeypatch):
    monkeypatch.setenv(URL_ENV, mongo_url)
    return database_resources(store, URL_ENV)


@pytest.fixture
def week(store: Store) -> Store:
    """user/big finalized 4 times over three days, user/twice twice, a malformed event, an event after the window."""
    store.events.insert_many(
        [
            event("user/big", "/splits", Reason.MISSING_HEARTBEAT, at(5)),
            event("user/big", "/splits", Reason.MISSING_HEARTBEAT, at(7)),
            event("user/big", "/splits", Reason.TERMINATED, at(9)),
            event(
                "user/big",
                "/first-rows",
                Reason.EXCEEDED_MAX_DURATION,
                at(10),
                **{Event.RETRY_OUTCOME: RetryOutcome.LIMIT_REACHED},
            ),
            event("user/twice", "/parquet", Reason.NEVER_HEARTBEATED, at(6)),
            event("user/twice", "/parquet", Reason.NEVER_HEARTBEATED, at(8)),
            event(None, "/parquet", Reason.MISSING_HEARTBEAT, at(8)),
            event("user/twice", "/parquet", Reason.MISSING_HEARTBEAT, at(11, 1)),  # the next day's window
        ]
    )
    return store


def materialize(resources, **config) -> dg.ExecuteInProcessResult:
    with dg.instance_for_test() as instance:
        return dg.materialize(
            [repeat_offenders],
            partition_key=DAY,
            resources=resources,
            instance=instance,
            run_config={"ops": {repeat_offenders.op.name: {"config": config}}} if config else None,
        )


def metadata_of(result: dg.ExecuteInProcessResult) -> dict:
    (materialization,) = result.asset_materializations_for_node(repeat_offenders.op.name)
    return {key: value.value for key, value in materialization.metadata.items()}


def check_of(result: dg.ExecuteInProcessResult):
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == CHECK_NAME
    return evaluation


def test_the_asset_materializes_the_week_with_its_counts_and_table(week, resources):
    result = materialize(resources)

    assert result.success
    metadata = metadata_of(result)
    assert metadata["window"] == "2024-03-04 00:00 – 2024-03-11 00:00 UTC"
    assert (metadata["threshold"], metadata["offenders"], metadata["offenders_listed"]) == (3, 1, 1)
    assert (metadata["finalizations"], metadata["datasets_finalized"], metadata["malformed_skipped"]) == (6, 2, 1)
    assert metadata["malformed"] == {"invalid_dataset": 1}
    rows = [record.data for record in metadata["offenders_table"].records]
    assert [(row["dataset"], row["type"], row["finalizations"]) for row in rows] == [
        ("user/big", "/splits", 3),
        ("user/big", "/first-rows", 1),
    ]
    assert (rows[0]["missing_heartbeat"], rows[0]["terminated"], rows[0]["first_seen"], rows[0]["last_seen"]) == (
        2,
        1,
        "2024-03-05 12:00:00",
        "2024-03-09 12:00:00",
    )
    assert (rows[1]["retry_limit_reached"], rows[1]["last_error"], rows[1]["error_from"]) == (
        True,
        "JobManagerExceededMaximumDurationError",
        "event",
    )
    assert metadata["job_types"]["/splits"] == {
        "datasets": 1,
        "finalizations": 3,
        "reasons": {"missing_heartbeat": 2, "terminated": 1},
        "retry_limit_reached": 0,
    }
    assert "**Repeat offenders 2024-03-04 00:00 – 2024-03-11 00:00 UTC**: 1 dataset" in metadata["report"]
    assert "| `user/big` | `/splits` | 3 (2 / 0 / 1 / 0) |" in metadata["report"]


def test_the_check_warns_over_the_threshold_and_names_the_datasets(week, resources):
    evaluation = check_of(materialize(resources, threshold=2))

    assert not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.description.startswith(
        "2 datasets finalized at least 2 times in 2024-03-04 00:00 – 2024-03-11 00:00 UTC"
    )
    assert evaluation.description.endswith(": user/big, user/twice")
    assert {key: value.value for key, value in evaluation.metadata.items()} == {
        "threshold": 2,
        "offenders": 2,
        "datasets": ["user/big", "user/twice"],
        "quarantined": [],
        "free_runs_spent": [],
    }


def test_the_check_passes_under_the_threshold(week, resources):
    result = materialize(resources, threshold=5)

    evaluation = check_of(result)
    assert evaluation.passed and evaluation.description is None
    assert metadata_of(result)["offenders"] == 0 and "offenders_table" not in metadata_of(result)


def test_a_shorter_window_leaves_the_older_days_out(week, resources):
    metadata = metadata_of(materialize(resources, window_days=2, threshold=2))  # 2024-03-09 and 2024-03-10

    assert (metadata["finalizations"], metadata["offenders"]) == (2, 1)  # user/big's last two


@pytest.mark.parametrize("config", [{"threshold": 1}, {"window_days": 0}, {"window_days": 91}, {"max_datasets": 0}])
def test_a_config_out_of_bounds_is_refused_before_anything_is_read(resources, config):
    with pytest.raises((pydantic.ValidationError, dg.DagsterInvalidConfigError)):
        materialize(resources, **config)


def test_the_asset_is_a_daily_statistic_run_by_the_statistics_job():
    assert repeat_offenders.partitions_def == DAILY_PARTITIONS
    assert repeat_offenders.group_names_by_key[repeat_offenders.key] == GROUP
    assert repeat_offenders.descriptions_by_key[repeat_offenders.key]
    defs = dg.Definitions(
        assets=[repeat_offenders],
        jobs=[duration_statistics_job],
        resources={"databases": Databases()},
    )
    job = defs.resolve_job_def(duration_statistics_job.name)
    assert repeat_offenders.key in job.asset_layer.asset_graph.get_all_asset_keys()
    assert {key.name for key in job.asset_layer.asset_graph.asset_check_keys} == {CHECK_NAME}


def test_the_statistics_report_has_a_section_on_the_windows_offenders(week, resources, tmp_path):
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics],
            selection=[
                job_duration_statistics
            ],  # no tallies: the report says the days are missing, the section is there
            partition_key=DAY,
            resources={**resources, "zombie_policy": ZombiePolicyResource(queue_generation=QUEUE_GENERATION)},
            instance=instance,
            run_config={
                "ops": {
                    job_duration_statistics.op.name: {
                        "config": {"reports_dir": str(tmp_path), "save_suggestions": False}
                    }
                }
            },
        )

    (materialization,) = result.asset_materializations_for_node(job_duration_statistics.op.name)
    section = text(materialization.metadata["repeat_offenders"])
    assert section.startswith(
        "**Repeat offenders 2024-03-04 00:00 – 2024-03-11 00:00 UTC**: 1 dataset finalized at least 3 times"
    )
    assert "| `user/big` | `/splits` |" in section
    assert section in Path(text(materialization.metadata["markdown"])).read_text()


def test_queue_health_counts_the_repeat_offenders_of_the_last_week(store, resources):
    now = utc_now()
    store.events.insert_many(
        [event("user/again", "/splits", Reason.MISSING_HEARTBEAT, now - dt.timedelta(days=days)) for days in (1, 2, 3)]
        + [event("user/once", "/splits", Reason.MISSING_HEARTBEAT, now - dt.timedelta(hours=1))]
        + [
            event("user/long-ago", "/splits", Reason.MISSING_HEARTBEAT, now - dt.timedelta(days=30 + days))
            for days in (1, 2, 3)
        ]
    )
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [queue_health],
            resources={**resources, "zombie_policy": ZombiePolicyResource()},
            instance=instance,
            selection=[queue_health],
        )

    (materialization,) = result.asset_materializations_for_node(queue_health.op.name)
    assert materialization.metadata["repeat_offenders"].value == 1
