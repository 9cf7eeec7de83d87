"""deploy/helm/values.yaml through Dagster's own chart: what Helm would install, not only which keys we wrote.

The chart is rendered offline with Helm's own engine (its Go SDK, through the helm-python-sdk package) from the
copy that ``scripts/dagster_chart.py setup`` puts in ``.cache/dagster-chart/<version>/``; the values are validated
against the chart's values.schema.json by Helm's own validation, as an install does. Then the instance
configuration the chart writes (the ``dagster.yaml`` of its ConfigMap) is read through Dagster's instance schema,
defaults filled in, and compared with deploy/dagster.yaml, section by section: a setting the chart does not render
(runMonitoring.maxRuntimeSeconds at this version) shows up as a difference. And the code location's Deployment
gets the image's command, its Secret, its user and the volume.

What this does not prove: that a cluster accepts the manifests (no Kubernetes here), nor anything about a chart
version other than the one in the cache. Skipped, saying how to set it up, when the chart or the SDK is absent
(CI has neither: the chart comes from a Dagster clone or `helm pull`, which CI cannot reach).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from dagster._core.instance.config import dagster_instance_config
from dagster._core.instance.methods.settings_methods import SettingsMethods

from tests.deploy.processes import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
CACHE_ENV = "ZOMBIE_DAGSTER_CHART_CACHE"
SETUP = "python scripts/dagster_chart.py setup --git-dir <dagster clone> | --archive <helm pull .tgz>, and pip install -e '.[chart]'"
IMAGE = {"repository": "registry.example/zombie-pipeline", "tag": "0123abc"}
#: The environment deploy/dagster.yaml reads, with the values the Helm values write as numbers.
INSTANCE_ENV = {"DAGSTER_MAX_CONCURRENT_RUNS": "10", "DAGSTER_DEQUEUE_INTERVAL_SECONDS": "5"}


def pinned_version() -> str:
    import tomllib

    for requirement in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, _, version = requirement.partition("==")
        if name == "dagster":
            return version
    raise AssertionError("pyproject.toml pins no dagster")


def chart_dir() -> Path:
    import os

    root = Path(os.environ[CACHE_ENV]) if os.environ.get(CACHE_ENV) else REPO_ROOT / ".cache" / "dagster-chart"
    return root / pinned_version()


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    path = chart_dir() / "manifest.json"
    if not path.exists():
        pytest.skip(f"Dagster's Helm chart {pinned_version()} is not in {chart_dir()}: {SETUP}")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def chart(manifest):
    helm = pytest.importorskip("helm_python", reason=f"helm-python-sdk renders the chart: {SETUP}")
    return helm.Chart.load(str(chart_dir() / "chart"))


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    """deploy/helm/values.yaml with the two values docs/deploy.md sets on the command line."""
    values = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    values["dagster-user-deployments"]["deployments"][0]["image"].update(IMAGE)
    return values


@pytest.fixture(scope="module")
def rendered(chart, values) -> dict[str, list[dict]]:
    manifests = chart.render(values, name="dagster", namespace="datasets-server")
    return {path: [doc for doc in yaml.safe_load_all(text) if doc] for path, text in manifests.items()}


def instance_section(instance_yaml: str, tmp_path: Path, monkeypatch) -> dict[str, Any]:
    """An instance file as Dagster reads it: variables resolved, defaults filled in."""
    for name, value in {**INSTANCE_ENV, "DAGSTER_PG_HOST": "h", "DAGSTER_PG_PORT": "5432", "DAGSTER_PG_USERNAME": "u",
                        "DAGSTER_PG_PASSWORD": "p", "DAGSTER_PG_DB": "d"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "dagster.yaml").write_text(instance_yaml)
    validated, _ = dagster_instance_config(str(tmp_path))
    return cast(dict[str, Any], validated)  # typed as a Mapping, built as a dict (what _Settings takes)


#: What the daemon reads of run monitoring and run retries, through DagsterInstance's own accessors (and defaults).
EFFECTIVE = [
    "run_monitoring_start_timeout_seconds", "run_monitoring_cancel_timeout_seconds", "run_monitoring_max_runtime_seconds",
    "run_monitoring_max_resume_run_attempts", "run_monitoring_poll_interval_seconds",
    "run_retries_enabled", "run_retries_max_retries", "run_retries_retry_on_asset_or_op_failure",
]  # fmt: skip


class _Settings(SettingsMethods):
    """The settings part of a DagsterInstance, over a validated instance file."""

    def __init__(self, validated: dict[str, Any]) -> None:
        self._validated = validated

    def get_settings(self, settings_key: str) -> Any:
        return self._validated.get(settings_key) or {}


def effective(validated: dict[str, Any]) -> dict[str, Any]:
    settings = _Settings(validated)
    return {name: getattr(settings, name) for name in EFFECTIVE} | {
        "run_monitoring_enabled": bool(settings.run_monitoring_settings.get("enabled"))
    }


def test_the_chart_in_the_cache_is_the_projects_dagster_version(manifest):
    if manifest["chart_version"] != manifest["pinned_version"]:
        pytest.skip(f"the cached chart is {manifest['chart_version']} ({manifest['source']}), not {manifest['pinned_version']}: "
                    "the other tests of this module checked that one")  # fmt: skip
    assert manifest["pinned_version"] == pinned_version()


def test_helm_accepts_the_values_against_the_charts_schema(chart, values):
    chart.validate_schema(chart.merge_values(values))  # raises, naming the key, where an install would refuse


def test_the_instance_the_chart_writes_has_the_settings_of_deploy_dagster_yaml(rendered, tmp_path, monkeypatch):
    [configmap] = [doc for docs in rendered.values() for doc in docs
                   if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"].endswith("-instance")]  # fmt: skip
    written = configmap["data"]["dagster.yaml"]
    # one section of each: the chart's own run_monitoring is off, ours comes from additionalInstanceConfig
    top_level = [
        line.split(":")[0]
        for line in written.splitlines()
        if line and not line[0].isspace() and not line.startswith("#")
    ]
    assert len(top_level) == len(set(top_level)), top_level
    chart_instance = instance_section(written, tmp_path / "chart", monkeypatch)
    ours = instance_section((DEPLOY / "dagster.yaml").read_text(), tmp_path / "ours", monkeypatch)

    assert chart_instance["run_launcher"]["class"] == "K8sRunLauncher"
    coordinator = chart_instance["run_coordinator"]
    assert coordinator["class"] == "QueuedRunCoordinator"
    assert coordinator["config"] == ours["run_queue"] | {
        key: int(INSTANCE_ENV[name]) for key, name in
        [("max_concurrent_runs", "DAGSTER_MAX_CONCURRENT_RUNS"), ("dequeue_interval_seconds", "DAGSTER_DEQUEUE_INTERVAL_SECONDS")]
    }  # fmt: skip
    # what the daemon applies: ours, the start timeout excepted (2 more minutes for a pod's image pull and scheduling)
    start_timeout = ours["run_monitoring"]["start_timeout_seconds"] + 120
    assert effective(chart_instance) == effective(ours) | {"run_monitoring_start_timeout_seconds": start_timeout}
    assert effective(chart_instance)["run_monitoring_max_runtime_seconds"] == 21600  # Dagster's default is 0: none
    assert chart_instance["retention"] == ours["retention"]
    assert chart_instance["telemetry"] == ours["telemetry"] == {"enabled": False}
    storage = chart_instance["run_storage"]["config"]["postgres_db"]
    assert storage["scheme"] == ours["storage"]["postgres"]["postgres_db"]["scheme"]


def test_the_code_location_runs_the_images_command_with_its_secret_user_and_volume(rendered):
    deployments = [doc for docs in rendered.values() for doc in docs
                   if doc.get("kind") == "Deployment" and "zombie-pipeline" in doc["metadata"]["name"]]  # fmt: skip
    [deployment] = deployments
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == f"{IMAGE['repository']}:{IMAGE['tag']}"
    command = [*container.get("command", []), *container.get("args", [])]
    assert command[:3] == ["dagster", "api", "grpc"] or command[:3] == ["dagster", "code-server", "start"], command
    assert "zombie_pipeline.definitions" in command and "defs" in command
    assert {"secretRef": {"name": "zombie-pipeline-env"}} in container["envFrom"]
    assert pod["securityContext"]["runAsUser"] == 10001
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert {"/opt/dagster/dagster_home/storage", "/opt/zombie_pipeline/home"} <= mounts
    assert {"name": "zombie-pipeline-data", "persistentVolumeClaim": {"claimName": "zombie-pipeline-data"}} in pod[
        "volumes"
    ]
