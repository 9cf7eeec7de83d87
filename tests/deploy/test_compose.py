"""deploy/docker-compose.yaml: the stack without Kubernetes, in one file, agreeing with the image and the instance.

No container engine runs here, so the stack is not started from this file: tests/deploy/test_production.py and
test_crash.py run the same commands (the image's code server, ``dagster-daemon run -w workspace.yaml``) with the
same instance file natively. This checks that the file runs those commands, gives every Dagster process the
instance and its variables, keeps what runs write in volumes, restarts the code location, and reads everything
from the environment file, whose template holds no secret; and, where Docker Compose is installed (``docker
compose`` or Debian's ``docker-compose``; .ci/run installs the latter), that Compose itself accepts the file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy import processes
from tests.deploy.processes import REPO_ROOT
from zombie_pipeline import config

DEPLOY = REPO_ROOT / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
SERVICES = COMPOSE["services"]
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
ENV_TEMPLATE = DEPLOY / "zombie-pipeline.env.example"
DAGSTER_SERVICES = ("zombie-pipeline", "dagster-daemon", "dagster-webserver")
CODE_LOCATION = "zombie-pipeline"


def template_env() -> dict[str, str]:
    lines = [line for line in ENV_TEMPLATE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def dockerfile_env(name: str) -> str:
    match = re.search(rf"\b{name}=(\S+)", DOCKERFILE)
    assert match, name
    return match.group(1)


def mounts(service: str) -> dict[str, str]:
    """Container path -> source of each volume of a service."""
    found = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        found[target] = source
    return found


def test_the_stack_is_postgresql_the_code_location_the_daemon_and_the_webserver():
    assert set(SERVICES) == {"postgresql", *DAGSTER_SERVICES}
    image = SERVICES[CODE_LOCATION]["image"]
    assert all(SERVICES[name]["image"] == image for name in DAGSTER_SERVICES)  # one image, one Dagster version
    assert SERVICES[CODE_LOCATION]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert re.fullmatch(r"postgres:15\.\d+-\w+", SERVICES["postgresql"]["image"])  # a release, not a floating tag


def test_it_runs_the_commands_the_production_tests_run():
    workspace = "/opt/dagster/dagster_home/workspace.yaml"
    assert "command" not in SERVICES[CODE_LOCATION]  # the image's CMD, which test_files checks against the tests'
    assert SERVICES["dagster-daemon"]["command"] == processes.daemon_command(workspace)
    assert SERVICES["dagster-webserver"]["command"] == processes.webserver_command(workspace, "0.0.0.0", 3000)
    assert mounts("dagster-daemon")[workspace] == mounts("dagster-webserver")[workspace] == "./workspace.yaml"


def test_every_dagster_process_gets_the_instance_file_and_the_environment_file():
    home = dockerfile_env("DAGSTER_HOME")
    for name in DAGSTER_SERVICES:
        assert mounts(name)[f"{home}/dagster.yaml"] == "./dagster.yaml", name
        assert SERVICES[name]["env_file"] == ENV_TEMPLATE.name.removesuffix(".example"), name
    env = template_env()
    assert env["ZOMBIE_CODE_SERVER_HOST"] == CODE_LOCATION
    assert env["ZOMBIE_CODE_SERVER_PORT"] in DOCKERFILE.split("EXPOSE ")[1].split()[0]
    assert env["DAGSTER_PG_HOST"] == "postgresql"


def test_what_runs_write_is_kept_in_volumes_and_the_code_location_comes_back_after_a_crash():
    home, pipeline_home = dockerfile_env("DAGSTER_HOME"), dockerfile_env("ZOMBIE_PIPELINE_HOME")
    code_location = mounts(CODE_LOCATION)
    named = set(COMPOSE["volumes"])
    assert code_location[f"{home}/storage"] in named and code_location[pipeline_home] in named
    assert mounts("dagster-webserver")[f"{home}/storage"] == code_location[f"{home}/storage"]  # the runs' logs
    assert f"mkdir -p {home}/storage {pipeline_home}" in DOCKERFILE  # owned by the image's user, so writable
    assert all(SERVICES[name]["restart"] == "unless-stopped" for name in SERVICES)
    assert SERVICES["dagster-daemon"]["depends_on"][CODE_LOCATION] == {"condition": "service_healthy"}


def test_every_variable_is_in_the_template_and_no_secret_is():
    env = template_env()
    instance = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    workspace = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())
    from tests.deploy.test_files import env_names

    for name in [*env_names(instance), *env_names(workspace), config.QUEUE_URL_ENV, config.CACHE_URL_ENV,
                 config.QUEUE_DATABASE_ENV, config.CACHE_DATABASE_ENV, config.KILL_CRON_ENV, config.WEBHOOK_URL_ENV,
                 config.CLEANUP_OVERDUE_MINUTES_ENV]:  # fmt: skip
        assert name in env, f"{name} is not in {ENV_TEMPLATE.name}"
    assert all(env[name] == "" for name in ("DAGSTER_PG_PASSWORD", config.QUEUE_URL_ENV, config.CACHE_URL_ENV))
    interpolated = set(re.findall(r"(?<!\$)\$\{(\w+)", (DEPLOY / "docker-compose.yaml").read_text()))
    assert interpolated <= set(env), interpolated - set(env)
    text = (DEPLOY / "docker-compose.yaml").read_text()
    assert not re.search(r"mongodb(\+srv)?://", text)
    assert not re.search(
        r"^\s*\w*password\w*:\s*[^\s$]", text, re.IGNORECASE | re.MULTILINE
    )  # only ${...} from the env file
    assert SERVICES["dagster-webserver"]["ports"] == ["127.0.0.1:3000:3000"]  # not published beyond the host
    assert "deploy/zombie-pipeline.env" in (REPO_ROOT / ".gitignore").read_text().splitlines()


def compose_command() -> list[str]:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    compose = shutil.which("docker-compose")
    if compose:
        return [compose]
    pytest.skip("neither `docker compose` nor `docker-compose` is installed (apt-get install docker-compose)")


def compose_config(directory: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``compose config`` on a copy of deploy/ with ``env`` as its environment file: no engine needed."""
    deploy = directory / "deploy"
    deploy.mkdir()
    for name in ("docker-compose.yaml", "dagster.yaml", "workspace.yaml"):
        shutil.copy(DEPLOY / name, deploy / name)
    (deploy / "zombie-pipeline.env").write_text("".join(f"{name}={value}\n" for name, value in env.items()))
    return subprocess.run(
        [*compose_command(), "-p", "zombie-pipeline", "-f", str(deploy / "docker-compose.yaml"),
         "--env-file", str(deploy / "zombie-pipeline.env"), "config"],
        cwd=directory, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_compose_accepts_the_file_once_the_environment_file_is_filled_in(tmp_path):
    env = template_env() | {"ZOMBIE_PIPELINE_IMAGE": "zombie-pipeline:0123abc", "DAGSTER_PG_PASSWORD": "not-a-secret"}
    done = compose_config(tmp_path, env)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert set(resolved["services"]) == {"postgresql", *DAGSTER_SERVICES}
    assert resolved["services"]["postgresql"]["environment"]["POSTGRES_PASSWORD"] == "not-a-secret"
    for name in DAGSTER_SERVICES:
        assert resolved["services"][name]["environment"]["DAGSTER_PG_HOST"] == "postgresql", name


def test_compose_refuses_the_template_as_it_is_naming_what_to_set(tmp_path):
    done = compose_config(tmp_path, template_env())
    assert done.returncode != 0
    assert "ZOMBIE_PIPELINE_IMAGE" in done.stderr or "DAGSTER_PG_PASSWORD" in done.stderr, done.stderr
