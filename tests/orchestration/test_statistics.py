"""The duration-statistics assets, materialized in process against the test server."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pydantic
import pytest
from bson import ObjectId

from zombie_pipeline.documents import (
    DEFAULT_EVENTS_COLLECTION,
    DEFAULT_JOBS_COLLECTION,
    DEFAULT_SUGGESTIONS_COLLECTION,
    ID,
    Job,
    Status,
)
from zombie_pipeline.durations import BadData, analyze_window, latest_suggested_max_durations
from zombie_pipeline.orchestration.assets import (
    ASSETS,
    DAILY_PARTITIONS,
    GROUP,
    STATS_JOBS,
    SUGGESTED_T2_METADATA_PREFIX,
    job_duration_statistics,
    job_duration_tallies,
)
from zombie_pipeline.orchestration.resources import QueueDatabase, ZombiePolicyResource
from zombie_pipeline.simulate import Workload, simulate

URL_ENV = "ZOMBIE_STATS_TEST_MONGO_URL"
UTC = dt.timezone.utc


@pytest.fixture
def resources(mongo_url, queue_db, monkeypatch):
    monkeypatch.setenv(URL_ENV, mongo_url)
    return {
        "queue_db": QueueDatabase(url_env_var=URL_ENV, database=queue_db.name),
        "zombie_policy": ZombiePolicyResource(max_duration_seconds_by_type={"/first-rows": 1800}),
    }


def _statistics_config(reports_dir: Path, **options) -> dict:
    return {"ops": {job_duration_statistics.op.name: {"config": {"reports_dir": str(reports_dir), **options}}}}


def _metadata(result: dg.ExecuteInProcessResult, asset: dg.AssetsDefinition) -> dict:
    (materialization,) = result.asset_materializations_for_node(asset.op.name)
    return {key: value.value for key, value in materialization.metadata.items()}


def test_daily_tallies_combine_into_the_window_statistics_of_one_pass(resources, queue_db, cache_db, tmp_path):
    end = dt.datetime(2024, 3, 11, tzinfo=UTC)
    simulate(
        queue_db,
        cache_db,
        Workload(finished=500, crashed=0, never_heartbeated=0, overdue=0, running=0, waiting=0, days=2, seed=7),
        now=end,
    )
    with dg.instance_for_test() as instance:
        for day in ("2024-03-09", "2024-03-10"):
            daily = dg.materialize([job_duration_tallies], partition_key=day, resources=resources, instance=instance)
            assert daily.success
        window = dg.materialize(
            [job_duration_tallies, job_duration_statistics],
            selection=[job_duration_statistics],  # the window reads no job: only the stored tallies
            partition_key="2024-03-10",
            resources=resources,
            instance=instance,
            run_config=_statistics_config(tmp_path, window_days=2),
        )

    metadata = _metadata(window, job_duration_statistics)
    jobs, events = queue_db[DEFAULT_JOBS_COLLECTION], queue_db[DEFAULT_EVENTS_COLLECTION]
    one_pass = analyze_window(jobs, events, resources["zombie_policy"].policy(), end=end, window_days=2)
    assert (metadata["days_in_window"], metadata["days_missing"]) == (2, 0)
    suggested = {key[len(SUGGESTED_T2_METADATA_PREFIX):]: value for key, value in metadata.items() if key.startswith(SUGGESTED_T2_METADATA_PREFIX)}
    assert suggested == {job_type.lstrip("/"): float(seconds) for job_type, seconds in one_pass.suggested_max_durations().items()}
    assert len(suggested) == 9
    assert "| `/first-rows` |" in metadata["statistics"] and "30 min" in metadata["statistics"]
    assert "max_duration_seconds_by_type" in metadata["zombie_policy_snippet"]
    for name in ("csv", "json", "markdown", "chart"):
        assert Path(metadata[name]).parent == tmp_path and Path(metadata[name]).stat().st_size > 0
    stored = latest_suggested_max_durations(queue_db[DEFAULT_SUGGESTIONS_COLLECTION])
    assert stored == one_pass.suggested_max_durations()
    assert queue_db[DEFAULT_SUGGESTIONS_COLLECTION].find_one({ID: end}) is not None


def test_days_not_computed_yet_are_listed_and_bad_data_counted(resources, queue_db, tmp_path):
    noon = dt.datetime(2024, 3, 10, 12, tzinfo=UTC)
    queue_db[DEFAULT_JOBS_COLLECTION].insert_many(
        [
            {ID: ObjectId(), Job.TYPE: "/a", Job.STATUS: Status.SUCCESS, Job.STARTED_AT: noon, Job.FINISHED_AT: noon - dt.timedelta(seconds=5)},
            {ID: ObjectId(), Job.TYPE: "/a", Job.STATUS: Status.SUCCESS, Job.STARTED_AT: noon - dt.timedelta(seconds=5), Job.FINISHED_AT: noon},
        ]
    )
    with dg.instance_for_test() as instance:
        daily = dg.materialize([job_duration_tallies], partition_key="2024-03-10", resources=resources, instance=instance)
        window = dg.materialize(
            [job_duration_tallies, job_duration_statistics],
            selection=[job_duration_statistics],
            partition_key="2024-03-10",
            resources=resources,
            instance=instance,
            run_config=_statistics_config(tmp_path, window_days=3, save_suggestions=False),
        )

    assert _metadata(daily, job_duration_tallies)["bad_data"] == {BadData.FINISHED_BEFORE_STARTED: 1}
    metadata = _metadata(window, job_duration_statistics)
    assert (metadata["days_in_window"], metadata["days_missing"]) == (1, 2)
    assert metadata["skipped_documents"] == 1
    assert "2024-03-08, 2024-03-09" in metadata["statistics"]
    assert not any(key.startswith(SUGGESTED_T2_METADATA_PREFIX) for key in metadata)  # 1 job: not enough data
    assert queue_db[DEFAULT_SUGGESTIONS_COLLECTION].count_documents({}) == 0


def test_an_out_of_range_setting_fails_the_run_before_anything_is_read(monkeypatch, tmp_path):
    monkeypatch.setenv(URL_ENV, "mongodb://127.0.0.1:1/?directConnection=true")  # nothing listens there
    unreachable = {
        "queue_db": QueueDatabase(url_env_var=URL_ENV, database="unused", server_selection_timeout_ms=200),
        "zombie_policy": ZombiePolicyResource(),
    }
    with dg.instance_for_test() as instance, pytest.raises(pydantic.ValidationError, match="quantile"):
        dg.materialize(
            [job_duration_tallies, job_duration_statistics],
            selection=[job_duration_statistics],
            partition_key="2024-03-10",
            resources=unreachable,
            instance=instance,
            run_config=_statistics_config(tmp_path, quantile=1.5),
        )


def test_the_assets_form_a_daily_group_with_a_partitioned_job():
    defs = dg.Definitions(
        assets=ASSETS,
        jobs=STATS_JOBS,
        resources={"queue_db": QueueDatabase(), "zombie_policy": ZombiePolicyResource()},
    )
    dg.Definitions.validate_loadable(defs)

    for asset in ASSETS:
        assert asset.group_names_by_key[asset.key] == GROUP
        assert asset.descriptions_by_key[asset.key]
        assert asset.partitions_def == DAILY_PARTITIONS
    job = defs.resolve_job_def(STATS_JOBS[0].name)
    assert isinstance(job.partitions_def, dg.DailyPartitionsDefinition)
