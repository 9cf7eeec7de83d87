"""The duration-statistics assets, materialized in process against the test server."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
from bson import ObjectId

from tests.helpers import METRICS_OFF, QUEUE_GENERATION, database_resources, found, job_document, workload
from zombie_pipeline.defs.resources import (
    Databases,
    ZombiePolicyResource,
)
from zombie_pipeline.defs.statistics.assets import (
    DAILY_PARTITIONS,
    DEPLOYMENT_LIMIT_METADATA,
    GROUP,
    SUGGESTED_T2_METADATA_PREFIX,
    duration_statistics_job,
    job_duration_statistics,
    job_duration_tallies,
)
from zombie_pipeline.defs.statistics.heartbeat_gaps import heartbeat_gap_tallies
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.marks import simulation_id
from zombie_pipeline.simulation.ownership import drop_simulation
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.statistics.charts import INLINE_MARKDOWN_LIMIT
from zombie_pipeline.statistics.suggestion_log import latest_suggested_max_durations
from zombie_pipeline.statistics.tallies import BadData
from zombie_pipeline.statistics.window import analyze_window

URL_ENV = "ZOMBIE_STATS_TEST_MONGO_URL"
UTC = dt.UTC


@pytest.fixture
def resources(mongo_url, store, monkeypatch):
    monkeypatch.setenv(URL_ENV, mongo_url)
    return {
        **database_resources(store, URL_ENV),
        # the queue's generation named: a few bare job documents are evidence of none
        "zombie_policy": ZombiePolicyResource(
            max_duration_seconds_by_type={"/first-rows": 1800}, queue_generation=QUEUE_GENERATION
        ),
    }


def _statistics_config(reports_dir: Path, **options) -> dict:
    return {"ops": {job_duration_statistics.op.name: {"config": {"reports_dir": str(reports_dir), **options}}}}


def _metadata(result: dg.ExecuteInProcessResult, asset: dg.AssetsDefinition) -> dict:
    (materialization,) = result.asset_materializations_for_node(asset.op.name)
    return {key: value.value for key, value in materialization.metadata.items()}


def test_daily_tallies_combine_into_the_window_statistics_of_one_pass(resources, store: Store, tmp_path):
    end = dt.datetime(2024, 3, 11, tzinfo=UTC)
    simulate(
        store,
        workload(finished=500, crashed=0, never_heartbeated=0, overdue=0, running=0, waiting=0, days=2, seed=7),
        now=end,
    )
    with dg.instance_for_test() as instance:
        for day in ("2024-03-09", "2024-03-10"):
            daily = dg.materialize([job_duration_tallies], partition_key=day, resources=resources, instance=instance)
            assert daily.success
            assert_plottable_per_type(
                _metadata(daily, job_duration_tallies), daily.output_for_node(job_duration_tallies.op.name)
            )
        window = dg.materialize(
            [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics],
            selection=[job_duration_statistics],  # the window reads no job: only the stored tallies
            partition_key="2024-03-10",
            resources=resources,
            instance=instance,
            run_config=_statistics_config(tmp_path, window_days=2),
        )

    metadata = _metadata(window, job_duration_statistics)
    generation = QUEUE_GENERATIONS[QUEUE_GENERATION]
    one_pass = analyze_window(store, generation, resources["zombie_policy"].policy(), end=end, window_days=2)
    assert (metadata["days_present"], metadata["days_expected"], metadata["missing_days"]) == (2, 2, [])
    assert metadata["window_complete"] and "to_complete_it" not in metadata
    assert metadata["types_to_change"] == len(one_pass.t2_changes())
    assert metadata[DEPLOYMENT_LIMIT_METADATA] == found(one_pass.deployment_limit).seconds
    suggested = {
        key[len(SUGGESTED_T2_METADATA_PREFIX) :]: value
        for key, value in metadata.items()
        if key.startswith(SUGGESTED_T2_METADATA_PREFIX)
    }
    assert suggested == {
        job_type.lstrip("/"): float(seconds) for job_type, seconds in one_pass.suggested_max_durations().items()
    }
    assert len(suggested) == 9
    assert "| `/first-rows` |" in metadata["statistics"] and "30 min" in metadata["statistics"]
    assert "max_duration_seconds_by_type" in metadata["zombie_policy_snippet"]
    for name in ("csv", "json", "markdown", "chart"):
        assert Path(metadata[name]).parent == tmp_path and Path(metadata[name]).stat().st_size > 0
    assert Path(metadata["markdown"]).name == "durations_2024-03-09_2024-03-10.md"
    charts = {key: value for key, value in metadata.items() if key.startswith("chart/")}
    assert set(charts) == {f"chart/{job_type.lstrip('/')}" for job_type in one_pass.suggested_max_durations()}
    for chart in charts.values():
        marked = [line for line in chart.splitlines() if "◀" in line]
        assert len(chart) < INLINE_MARKDOWN_LIMIT and any("suggested T2" in line for line in marked), (
            chart
        )  # shown inline
    stored = latest_suggested_max_durations(store.suggestions)
    assert stored == one_pass.suggested_max_durations()
    assert store.suggestions.find_one({ID: end}) is not None


def test_days_not_computed_yet_are_listed_and_bad_data_counted(resources, store: Store, tmp_path):
    noon = dt.datetime(2024, 3, 10, 12, tzinfo=UTC)
    store.jobs.insert_many(
        [
            {
                ID: ObjectId(),
                Job.TYPE: "/a",
                Job.STATUS: Status.SUCCESS,
                Job.STARTED_AT: noon,
                Job.FINISHED_AT: noon - dt.timedelta(seconds=5),
            },
            {
                ID: ObjectId(),
                Job.TYPE: "/a",
                Job.STATUS: Status.SUCCESS,
                Job.STARTED_AT: noon - dt.timedelta(seconds=5),
                Job.FINISHED_AT: noon,
            },
        ]
    )
    with dg.instance_for_test() as instance:
        daily = dg.materialize(
            [job_duration_tallies], partition_key="2024-03-10", resources=resources, instance=instance
        )
        window = dg.materialize(
            [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics],
            selection=[job_duration_statistics],
            partition_key="2024-03-10",
            resources=resources,
            instance=instance,
            run_config=_statistics_config(tmp_path, window_days=3, save_suggestions=False),
        )

    assert _metadata(daily, job_duration_tallies)["bad_data"] == {BadData.FINISHED_BEFORE_STARTED: 1}
    assert {key: value for key, value in _metadata(daily, job_duration_tallies).items() if "/" in key} == {
        "runs/a": 1,
        "zombies/a": 0,
        "p50_seconds/a": 5.0,
        "p99_seconds/a": 5.0,
    }
    metadata = _metadata(window, job_duration_statistics)
    assert (
        Path(metadata["markdown"]).name == "durations_2024-03-08_2024-03-10_partial-1of3.md"
    )  # never the full report's name
    partial = "(partial: 1 of its 3 days; lacks 2024-03-08 – 2024-03-09)"
    assert partial in metadata["window"] and partial in metadata["statistics"]
    assert (metadata["days_present"], metadata["days_expected"], metadata["missing_days"]) == (
        1,
        3,
        ["2024-03-08", "2024-03-09"],
    )
    assert not metadata["window_complete"]
    assert metadata["skipped_documents"] == 1
    assert not any(key.startswith(SUGGESTED_T2_METADATA_PREFIX) for key in metadata)  # 1 job: not enough data
    assert store.suggestions.count_documents({}) == 0


def test_in_a_backfill_each_report_says_whether_its_window_is_complete_and_what_a_partial_one_lacks(
    resources, store: Store, tmp_path
):
    """A backfill of the statistics job over three days, oldest first: the window of three days ending with each."""
    days = ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04"]  # the daily partitions start on 2024-01-01
    with dg.instance_for_test() as instance:
        reports = {}
        for day in days:
            run = dg.materialize(
                [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics],
                partition_key=day,
                resources=resources,
                instance=instance,
                run_config=_statistics_config(tmp_path, window_days=3, save_suggestions=False),
            )
            reports[day] = _metadata(run, job_duration_statistics)

    assert [reports[day]["window_complete"] for day in days] == [False, False, True, True]
    assert reports["2024-01-02"]["missing_days"] == ["2023-12-31"]
    assert reports["2024-01-02"]["to_complete_it"] == (
        "2023-12-31 before the first daily partition (2024-01-01; ZOMBIE_STATISTICS_START moves it): this window "
        "cannot be complete"
    )
    assert "(partial: 2 of its 3 days; lacks 2023-12-31)" in reports["2024-01-02"]["window"]
    assert "(complete: 3 days)" in reports["2024-01-03"]["window"]
    assert Path(reports["2024-01-03"]["markdown"]).name == "durations_2024-01-01_2024-01-03.md"


def test_a_partial_window_says_which_days_to_compute_to_complete_it(resources, store: Store, tmp_path):
    with dg.instance_for_test() as instance:
        run = dg.materialize(
            [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics],
            partition_key="2024-03-10",
            resources=resources,
            instance=instance,
            run_config=_statistics_config(tmp_path, window_days=4, save_suggestions=False),
        )

    assert _metadata(run, job_duration_statistics)["to_complete_it"] == (
        "2024-03-07 – 2024-03-09 not computed yet: materialize job_duration_tallies for them, then this partition again"
    )


def test_days_read_from_a_simulation_dropped_since_are_left_out_of_the_window_and_named(
    resources, store: Store, tmp_path
):
    """``simulate --drop`` then a backfill of the last day only: the day before, computed from the dropped databases,
    is not mixed into the new ones' window."""
    end = dt.datetime(2024, 3, 11, tzinfo=UTC)
    history = workload(finished=300, crashed=0, never_heartbeated=0, overdue=0, running=0, waiting=0, days=2)
    simulate(store, history, now=end)
    first = simulation_id(store)
    with dg.instance_for_test() as instance:
        for day in ("2024-03-09", "2024-03-10"):
            assert dg.materialize(
                [job_duration_tallies], partition_key=day, resources=resources, instance=instance
            ).success
        drop_simulation(store)
        simulate(store, replace(history, seed=8), now=end)
        assert simulation_id(store) not in (None, first)
        window = dg.materialize(
            [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics],
            partition_key="2024-03-10",
            resources=resources,
            instance=instance,
            run_config=_statistics_config(tmp_path, window_days=2, save_suggestions=False),
        )
        logged = [record.user_message for record in instance.all_logs(window.run_id)]

    metadata = _metadata(window, job_duration_statistics)
    assert metadata["days_of_other_databases"] == ["2024-03-09"]
    assert (metadata["days_present"], metadata["missing_days"]) == (1, ["2024-03-09"])
    assert any("the tallies of 2024-03-09 were read from other databases than these" in line for line in logged)
    assert not any("Couldn't load partition" in line for line in logged)  # the window's unused days: no noise


def assert_plottable_per_type(metadata: dict, period) -> None:
    """Per type, numbers the UI plots over the daily partitions, under keys without the type's leading slash."""
    for job_type, tally in period.tallies.items():
        name = job_type.lstrip("/")
        assert metadata[f"runs/{name}"] == sum(tally.statuses.values())
        assert metadata[f"zombies/{name}"] == sum(tally.zombies.values())
        durations = sorted(float(value) for value in tally.success)
        assert metadata[f"p50_seconds/{name}"] == pytest.approx(float(np.percentile(durations, 50)), abs=1e-3)
        assert metadata[f"p99_seconds/{name}"] == pytest.approx(float(np.percentile(durations, 99)), abs=1e-3)
    assert not any(key.startswith("/") or "//" in key for key in metadata)


def test_daily_tallies_of_a_queue_whose_generation_cannot_be_told_fail_in_one_line_with_the_candidates(
    resources, store: Store
):
    store.jobs.insert_one(
        {**job_document(dataset="u/odd", status=Status.SUCCESS), Job.REVISION: "r1"}
    )  # 2023-01 and 2023-05 at once
    undecided = {**resources, "zombie_policy": ZombiePolicyResource()}
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [job_duration_tallies],
            partition_key="2024-03-10",
            resources=undecided,
            instance=instance,
            raise_on_error=False,
        )

    assert not result.success
    [failure] = [event.step_failure_data.user_failure_data for event in result.all_events if event.is_step_failure]
    assert failure is not None and failure.description is not None
    assert failure.description.startswith("the queue's evidence contradicts itself") and "\n" not in failure.description
    assert failure.metadata["queue_generation_candidates"].value == []


def test_an_out_of_range_setting_fails_the_run_before_anything_is_read(monkeypatch, tmp_path):
    monkeypatch.setenv(URL_ENV, "mongodb://127.0.0.1:1/?directConnection=true")  # nothing listens there
    unreachable = {
        "databases": Databases(
            queue_url=dg.EnvVar(URL_ENV),
            cache_url=dg.EnvVar(URL_ENV),
            queue_database="unused",
            cache_database="unused",
            timeout_ms=200,
        ),
        "zombie_policy": ZombiePolicyResource(),
        **METRICS_OFF,
    }
    refused = r"^invalid suggestion rules: quantile=1\.5: should be less than 1$"
    with dg.instance_for_test() as instance, pytest.raises(dg.Failure, match=refused):
        dg.materialize(
            [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics],
            selection=[job_duration_statistics],
            partition_key="2024-03-10",
            resources=unreachable,
            instance=instance,
            run_config=_statistics_config(tmp_path, quantile=1.5),
        )


def test_the_assets_form_a_daily_group_with_a_partitioned_job():
    assets = [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics]
    defs = dg.Definitions(
        assets=assets,
        jobs=[duration_statistics_job],
        resources={
            "databases": Databases(),
            "zombie_policy": ZombiePolicyResource(),
            **METRICS_OFF,
        },
    )

    for asset in assets:
        assert asset.group_names_by_key[asset.key] == GROUP
        assert asset.descriptions_by_key[asset.key]
        assert asset.partitions_def == DAILY_PARTITIONS
    job = defs.resolve_job_def(duration_statistics_job.name)
    assert isinstance(job.partitions_def, dg.DailyPartitionsDefinition)
