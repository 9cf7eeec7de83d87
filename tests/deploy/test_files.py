"""The deployment files agree with each other, with the code and with Dagster's own schema (no server needed).

deploy/dagster.yaml (an instance without Kubernetes) and deploy/helm/values.yaml (the chart's keys for the
same instance) say the same things; the run-queue limits name the tags the jobs carry; the image installs
the project's pins and serves the command the production test serves; every variable the files read is in
docs/deploy.md.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from dagster._core.instance.config import dagster_instance_config

from tests.deploy.processes import REPO_ROOT
from tests.helpers import found
from zombie_pipeline import config
from zombie_pipeline.defs.cleanup.jobs import CLEANUP_MAX_RUNTIME_SECONDS, kill_zombies_job
from zombie_pipeline.defs.statistics.assets import duration_statistics_job
from zombie_pipeline.defs.tags import (
    MAX_RETRIES_TAG,
    MAX_RUNTIME_TAG,
    PIPELINE_TAG,
    QUEUE_DATABASE_TAG,
    RETRY_STRATEGY_TAG,
    STATISTICS_GROUP,
)

DEPLOY = REPO_ROOT / "deploy"
INSTANCE = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
WORKSPACE = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())
HELM = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
DOCS = (REPO_ROOT / "docs" / "deploy.md").read_text()


def env_names(document: Any) -> Iterator[str]:
    """Every variable a Dagster YAML document reads with ``{env: NAME}``."""
    if isinstance(document, dict):
        if set(document) == {"env"}:
            yield document["env"]
        for value in document.values():
            yield from env_names(value)
    elif isinstance(document, list):
        for value in document:
            yield from env_names(value)


def dockerfile_command(instruction: str) -> list[str]:
    """The exec-form (JSON) command of ``CMD`` or ``HEALTHCHECK ... CMD``, continuation lines joined."""
    for line in DOCKERFILE.replace("\\\n", " ").splitlines():
        if line.startswith(instruction + " "):
            return json.loads(line[line.index("CMD") + 3 :])
    raise AssertionError(f"no {instruction} in the Dockerfile")


def test_dagster_accepts_the_instance_file_once_its_variables_are_set(tmp_path, monkeypatch):
    for name in env_names(INSTANCE):
        monkeypatch.setenv(name, "5432" if name.endswith(("PORT", "RUNS", "SECONDS")) else "x")
    shutil.copy(DEPLOY / "dagster.yaml", tmp_path / "dagster.yaml")
    validated, _ = dagster_instance_config(str(tmp_path))
    assert validated["telemetry"] == {"enabled": False}


def test_every_connection_setting_and_queue_size_comes_from_the_environment():
    database = INSTANCE["storage"]["postgres"]["postgres_db"]
    assert all(set(value) == {"env"} for name, value in database.items() if name != "scheme")
    assert set(database) >= {"hostname", "port", "username", "password", "db_name"}
    assert all(
        set(INSTANCE["run_queue"][name]) == {"env"} for name in ("max_concurrent_runs", "dequeue_interval_seconds")
    )
    assert all(set(WORKSPACE["load_from"][0]["grpc_server"][name]) == {"env"} for name in ("host", "port"))


def test_every_variable_the_files_read_is_documented():
    for name in [*env_names(INSTANCE), *env_names(WORKSPACE)]:
        assert f"`{name}`" in DOCS, f"{name} is not in docs/deploy.md"
    for name in (config.QUEUE_URL_ENV, config.CACHE_URL_ENV, config.QUEUE_DATABASE_ENV, config.CACHE_DATABASE_ENV,
                 config.KILL_CRON_ENV, config.WEBHOOK_URL_ENV, config.PUSHGATEWAY_URL_ENV):  # fmt: skip
        assert f"`{name}`" in DOCS, f"{name} is not in docs/deploy.md"


def test_the_helm_values_set_the_same_queue_monitoring_retries_and_retention_as_the_instance_file():
    daemon = HELM["dagsterDaemon"]
    queue = daemon["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert daemon["runCoordinator"]["type"] == "QueuedRunCoordinator"
    assert queue["tagConcurrencyLimits"] == INSTANCE["run_queue"]["tag_concurrency_limits"]
    # run monitoring as a whole through additionalInstanceConfig (the chart drops maxRuntimeSeconds: see
    # test_helm_chart.py, which renders it), the chart's own block off so that there is one
    assert daemon["runMonitoring"] == {"enabled": False}
    monitoring, retries = HELM["additionalInstanceConfig"]["run_monitoring"], daemon["runRetries"]
    # 2 more minutes for a pod to start (image pull, scheduling)
    start_timeout = INSTANCE["run_monitoring"]["start_timeout_seconds"] + 120
    assert monitoring == INSTANCE["run_monitoring"] | {"start_timeout_seconds": start_timeout}
    instance_retries = INSTANCE["run_retries"]
    assert (retries["enabled"], retries["maxRetries"]) == (instance_retries["enabled"], instance_retries["max_retries"])
    retention = HELM["retention"]
    assert retention["enabled"]
    assert retention["schedule"]["purgeAfterDays"] == INSTANCE["retention"]["schedule"]["purge_after_days"]
    assert retention["sensor"]["purgeAfterDays"] == INSTANCE["retention"]["sensor"]["purge_after_days"]
    assert HELM["telemetry"] == INSTANCE["telemetry"] == {"enabled": False}
    assert HELM["postgresql"]["postgresqlScheme"] == INSTANCE["storage"]["postgres"]["postgres_db"]["scheme"]


#: Measured on a loaded 2-core host (issue 31): launches failed at Dagster's default gRPC timeout, and runs took up to
#: this long from queued to started.
DEFAULT_GRPC_TIMEOUT, LONGEST_START_MEASURED = 60, 103


def test_a_run_has_its_whole_grpc_timeout_to_be_launched_and_as_long_again_to_start_everywhere():
    """Starting a run is the daemon's call to the code server, bounded by Dagster's gRPC timeout (an environment
    variable of every process: the image's, and the chart's daemon and webserver), then its worker loading the code
    location; run monitoring fails a run not started within its start timeout, which must hold both."""
    grpc = int(found(re.search(r"DAGSTER_GRPC_TIMEOUT_SECONDS=(\d+)", DOCKERFILE)).group(1))
    assert grpc >= 3 * DEFAULT_GRPC_TIMEOUT and grpc > LONGEST_START_MEASURED
    assert INSTANCE["run_monitoring"]["start_timeout_seconds"] >= 2 * grpc
    for process in ("dagsterDaemon", "dagsterWebserver"):
        assert {"name": "DAGSTER_GRPC_TIMEOUT_SECONDS", "value": str(grpc)} in HELM[process]["env"], process
    assert "`DAGSTER_GRPC_TIMEOUT_SECONDS`" in DOCS and "`start_timeout_seconds`" in DOCS


def test_the_run_queue_limits_name_the_tags_the_jobs_carry():
    limits = {limit["key"]: limit for limit in INSTANCE["run_queue"]["tag_concurrency_limits"]}
    per_queue = limits[QUEUE_DATABASE_TAG]
    assert per_queue["limit"] == 1 and per_queue["value"] == {"applyLimitPerUniqueValue": True}
    assert kill_zombies_job.tags[QUEUE_DATABASE_TAG] == config.queue_database()
    statistics = limits[PIPELINE_TAG]
    assert statistics["value"] == STATISTICS_GROUP == found(duration_statistics_job.tags)[PIPELINE_TAG]
    assert kill_zombies_job.tags[PIPELINE_TAG] != statistics["value"]  # a cleanup never counts among statistics
    # the zombie killer is bounded and retried from its first step (deploy/dagster.yaml says why it may be)
    assert 0 < int(kill_zombies_job.tags[MAX_RUNTIME_TAG]) < INSTANCE["run_monitoring"]["max_runtime_seconds"]
    assert int(kill_zombies_job.tags[MAX_RUNTIME_TAG]) == CLEANUP_MAX_RUNTIME_SECONDS
    assert int(kill_zombies_job.tags[MAX_RETRIES_TAG]) > 0 and kill_zombies_job.tags[RETRY_STRATEGY_TAG] == "ALL_STEPS"
    assert MAX_RETRIES_TAG not in found(duration_statistics_job.tags)


def test_the_image_installs_the_projects_pins_and_nothing_for_tests_or_the_embedded_server():
    lines = (DEPLOY / "requirements.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    pins = {name.lower().replace("_", "-"): version for name, version in pins.items()}
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["deploy"]]:
        name, _, version = requirement.partition("==")
        if version:
            pinned = pins.get(name.lower())
            assert pinned == version, f"deploy/requirements.txt pins {name}=={pinned}, pyproject.toml {version}"
    assert not {"secantusdb", "pytest", "pytest-xdist", "hypothesis"} & set(pins)
    assert "zombie-pipeline" not in pins


def test_every_file_the_dockerfile_copies_exists_and_it_serves_what_the_production_test_serves():
    sources = [
        path for line in re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE, re.MULTILINE) for path in line.split()
    ]
    assert sources
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for source in sources:
        assert (REPO_ROOT / source).exists(), source
        assert f"!{source}" in ignored, f"{source} is left out of the build context"
    command = dockerfile_command("CMD")
    assert command[:3] == ["dagster", "code-server", "start"]
    assert (
        command[command.index("-m") + 1] == "zombie_pipeline.definitions" and command[command.index("-a") + 1] == "defs"
    )
    assert command[command.index("--location-name") + 1] == WORKSPACE["load_from"][0]["grpc_server"]["location_name"]
    port = command[command.index("-p") + 1]
    assert dockerfile_command("HEALTHCHECK")[:3] == ["dagster", "api", "grpc-health-check"]
    assert dockerfile_command("HEALTHCHECK")[-1] == port
    assert not re.search(
        r"^ENTRYPOINT", DOCKERFILE, re.MULTILINE
    )  # the Helm chart passes the whole command as arguments
    assert re.search(r"^USER (?!0|root)\S+", DOCKERFILE, re.MULTILINE)
    [deployment] = HELM["dagster-user-deployments"]["deployments"]
    assert deployment["codeServerArgs"] == ["-m", "zombie_pipeline.definitions", "-a", "defs"]
    assert str(deployment["port"]) == port
    assert deployment["envSecrets"] and "env" not in deployment  # every value from a Secret, none in values


@pytest.mark.parametrize("path", ["dagster.yaml", "workspace.yaml", "helm/values.yaml"])
def test_no_secret_is_written_in_a_deployment_file(path):
    settings = [line for line in (DEPLOY / path).read_text().splitlines() if not line.lstrip().startswith("#")]
    for line in settings:
        assert not re.search(r"mongodb(\+srv)?://", line), line
        assert not re.search(r"password:\s*[^\s\"]", line, re.IGNORECASE), line  # empty, or {env: ...} below


def test_a_cleanup_lost_with_its_code_location_frees_its_queue_within_the_documented_bound():
    """The runtime limit plus one poll of run monitoring: then the retry (or a tick) runs, in seconds (test_crash.py)."""
    bound = CLEANUP_MAX_RUNTIME_SECONDS + INSTANCE["run_monitoring"]["poll_interval_seconds"]
    assert bound == 330
    assert "5.5 minutes" in DOCS and "5.5 minutes" in (DEPLOY / "dagster.yaml").read_text()


def test_the_image_is_built_on_a_pinned_base_and_holds_the_run_launcher_of_the_charts_instance():
    default = found(re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)).group(1)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", default), default  # a patch release on a Debian release
    assert [line for line in DOCKERFILE.splitlines() if line.startswith("FROM ")] == [
        "FROM ${PYTHON_IMAGE} AS build",
        "FROM ${PYTHON_IMAGE}",
    ]
    pins = (DEPLOY / "requirements.txt").read_text()
    assert re.search(r"^dagster-k8s==0\.29\.27$", pins, re.MULTILINE)
    assert re.search(r"^kubernetes==", pins, re.MULTILINE)
