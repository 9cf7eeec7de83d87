"""The code location as a deployment and the UI see it: it loads (in process, and through the ``dagster`` CLI),
everything is described, grouped and wired to the right job, and no resource config holds a URL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import cast
from urllib.parse import quote_plus

import dagster as dg
import yaml

from tests.helpers import found
from zombie_pipeline.config import (
    CACHE_URL_ENV,
    DAGSTER_HOME_ENV,
    HOME_ENV,
    PUSHGATEWAY_URL_ENV,
    QUEUE_URL_ENV,
)
from zombie_pipeline.definitions import defs
from zombie_pipeline.defs.pushgateway import MetricsGateway, metrics_gateway_from_env
from zombie_pipeline.defs.resources import Databases, ZombiePolicyResource, resources_from_env

ROOT = Path(__file__).resolve().parent.parent
DAGSTER = Path(sys.executable).parent / "dagster"
REPOSITORY = defs.get_repository_def()


def test_the_whole_definitions_object_is_loadable():
    dg.Definitions.validate_loadable(defs)


def test_the_location_carries_the_database_and_policy_resources():
    resources = found(defs.resources)
    assert isinstance(resources["databases"], Databases)
    assert isinstance(resources["zombie_policy"], ZombiePolicyResource)


def test_the_location_pushes_metrics_to_the_gateway_its_environment_names(monkeypatch):
    assert isinstance(found(defs.resources)["metrics_gateway"], MetricsGateway)
    monkeypatch.setenv(PUSHGATEWAY_URL_ENV, "pushgateway.monitoring:9091")
    assert metrics_gateway_from_env().gateway == "pushgateway.monitoring:9091"
    monkeypatch.delenv(PUSHGATEWAY_URL_ENV)
    assert not metrics_gateway_from_env().enabled


def test_dagster_definitions_validate_passes_without_starting_or_showing_anything(tmp_path):
    password = "hunter2/secret"
    env = {key: value for key, value in os.environ.items() if key not in (DAGSTER_HOME_ENV, CACHE_URL_ENV)}
    env.update(
        {
            HOME_ENV: str(tmp_path / "home"),
            QUEUE_URL_ENV: f"mongodb://zombie:{quote_plus(password)}@127.0.0.1:9/?serverSelectionTimeoutMS=200",
        }
    )

    result = subprocess.run(
        [str(DAGSTER), "definitions", "validate", "-m", "zombie_pipeline.definitions"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Validation successful for code location zombie_pipeline.definitions" in output
    # loading the location neither starts the embedded server nor prints the URL's credentials
    assert not (tmp_path / "home" / "server.json").exists()
    for secret in (password, quote_plus(password)):
        assert secret not in output


#: The statistics' computing stack: imported by a statistics run, never by loading the code location.
STATISTICS_STACK = {"pandas", "pyarrow", "pymongoarrow", "matplotlib", "scipy"}


def test_loading_the_code_location_imports_nothing_of_the_statistics_computing_stack():
    """Every run starts by loading the whole code location (its worker imports zombie_pipeline.definitions): a cleanup
    must not wait for pandas and pyarrow, which only the statistics assets use, and import when they run."""
    probe = "import json, sys, zombie_pipeline.definitions; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = set(json.loads(result.stdout))
    assert {"dagster", "pymongo", "zombie_pipeline"} <= loaded
    assert loaded & STATISTICS_STACK == set()


def test_the_location_name_is_the_same_for_workspace_and_pyproject():
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    [entry] = workspace["load_from"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["dagster"]
    assert entry["python_module"]["location_name"] == pyproject["code_location_name"] == "zombie_pipeline"
    assert entry["python_module"]["module_name"] == pyproject["module_name"] == "zombie_pipeline.definitions"


def test_the_jobs_schedules_and_sensors_are_the_pipelines():
    jobs = {job.name for job in REPOSITORY.get_all_jobs() if not job.name.startswith("__")}
    assert jobs == {
        "kill_zombies_job",
        "lift_quarantine_job",
        "queue_health_job",
        "duration_statistics_job",
        "zombie_watch_job",
    }
    assert {s.name for s in REPOSITORY.schedule_defs} == {"kill_zombies_schedule", "duration_stats_schedule"}
    assert {s.name for s in REPOSITORY.sensor_defs} == {
        "stale_jobs_sensor",
        "job_types_sensor",
        "cleanup_checks_sensor",
        "pipeline_failure_sensor",
        "cleanup_overdue_sensor",
        "zombie_watch_sensor",
    }


def test_everything_an_operator_sees_has_a_description():
    described: list[dg.JobDefinition | dg.ScheduleDefinition | dg.SensorDefinition] = [
        *(job for job in REPOSITORY.get_all_jobs() if not job.name.startswith("__")),
        *REPOSITORY.schedule_defs,
        *REPOSITORY.sensor_defs,
    ]
    assert [item.name for item in described if not (item.description or "").strip()] == []
    graph = REPOSITORY.asset_graph
    assert [key for key in graph.get_all_asset_keys() if not (graph.get(key).description or "").strip()] == []
    assert [key for key in graph.asset_check_keys if not (graph.get(key).description or "").strip()] == []


def test_assets_are_grouped_as_one_pipeline():
    graph = REPOSITORY.asset_graph
    groups = {key.to_user_string(): graph.get(key).group_name for key in graph.get_all_asset_keys()}
    assert groups["queue_health"] == "zombie_cleanup"
    assert set(groups.values()) == {"zombie_cleanup", "duration_statistics"}


def test_the_checks_watch_queue_health_and_run_in_its_job():
    check_keys = {(key.asset_key.to_user_string(), key.name) for key in REPOSITORY.asset_graph.asset_check_keys}
    assert check_keys == {
        ("queue_health", "no_zombies_left"),
        ("queue_health", "zombies_have_cache_errors"),
        ("queue_health", "compensations_succeed"),
        ("queue_health", "cleanups_are_recent"),
        ("repeat_offenders", "no_repeat_offenders"),
    }
    job = defs.resolve_job_def("queue_health_job")
    assert {key.name for key in job.asset_layer.asset_graph.asset_check_keys} >= {
        "no_zombies_left",
        "zombies_have_cache_errors",
        "compensations_succeed",
    }


def test_sensors_target_the_right_jobs_and_write_only_when_turned_on():
    sensors = {sensor.name: sensor for sensor in REPOSITORY.sensor_defs}
    assert sensors["stale_jobs_sensor"].job_name == "kill_zombies_job"
    assert sensors["cleanup_checks_sensor"].job_name == "queue_health_job"
    assert sensors["stale_jobs_sensor"].default_status == dg.DefaultSensorStatus.STOPPED  # it launches cleanups
    for name in ("job_types_sensor", "cleanup_checks_sensor", "pipeline_failure_sensor"):
        assert sensors[name].default_status == dg.DefaultSensorStatus.RUNNING, name
    assert (
        sensors["stale_jobs_sensor"].minimum_interval_seconds == 30
    )  # Dagster daemon evaluates sensors every 30 s: the shortest that means anything
    # it alarms when no cleanup succeeds: on before the cleanups are, it would cry wolf
    assert sensors["cleanup_overdue_sensor"].default_status == dg.DefaultSensorStatus.STOPPED
    # the watcher writes too, but is on by default wherever a daemon runs: an operator turns it off (issue 34)
    assert sensors["zombie_watch_sensor"].job_name == "zombie_watch_job"
    assert sensors["zombie_watch_sensor"].default_status == dg.DefaultSensorStatus.RUNNING


def test_cleanup_is_partitioned_by_the_job_types_the_sensor_registers():
    job = defs.resolve_job_def("kill_zombies_job")
    assert isinstance(job.partitions_def, dg.DynamicPartitionsDefinition)
    assert job.partitions_def.name == "job_types"


def test_no_resource_config_holds_a_url(monkeypatch):
    """Resource config is shown in the UI: URLs (and their passwords) stay in the environment."""
    assert {"databases", "zombie_policy", "failure_webhook"} <= set(found(defs.resources))
    secret_urls = {
        "QUEUE_MONGO_URL": "mongodb://admin:pa55word@queue.example:27017",
        "CACHE_MONGO_URL": "mongodb://admin:pa55word@cache.example:27017",
        "ZOMBIE_FAILURE_WEBHOOK_URL": "https://hooks.example/services/T0KEN",
    }
    for name, value in secret_urls.items():
        monkeypatch.setenv(name, value)
    resources = resources_from_env()
    for name, resource in resources.items():
        shown = str(cast(dg.ConfigurableResource, resource).model_dump())
        assert "://" not in shown and "pa55word" not in shown and "T0KEN" not in shown, name
    assert "pa55word" not in repr(resources["databases"].describe())
