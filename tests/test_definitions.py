"""The code location loads: in-process, and through the ``dagster`` CLI as a deployment would load it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote_plus

import dagster as dg

from zombie_pipeline.definitions import defs
from zombie_pipeline.orchestration.resources import CacheDatabase, QueueDatabase, ZombiePolicyResource

REPO_ROOT = Path(__file__).resolve().parent.parent
DAGSTER = Path(sys.executable).parent / "dagster"


def test_the_whole_definitions_object_is_loadable():
    dg.Definitions.validate_loadable(defs)


def test_the_location_carries_the_database_and_policy_resources():
    resources = defs.resources
    assert isinstance(resources["queue_db"], QueueDatabase)
    assert isinstance(resources["cache_db"], CacheDatabase)
    assert isinstance(resources["zombie_policy"], ZombiePolicyResource)


def test_dagster_definitions_validate_passes_without_starting_or_showing_anything(tmp_path):
    password = "hunter2/secret"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DAGSTER_HOME", "CACHE_MONGO_URL")
    }
    env.update(
        ZOMBIE_PIPELINE_HOME=str(tmp_path / "home"),
        QUEUE_MONGO_URL=f"mongodb://zombie:{quote_plus(password)}@127.0.0.1:9/?serverSelectionTimeoutMS=200",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
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
