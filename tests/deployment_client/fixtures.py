"""pytest fixtures for the deployment's real client; import them into a test module::

    from tests.deployment_client.fixtures import deployment, deployment_session  # noqa: F401

``deployment`` is a :class:`~deployment.DeploymentClient` connected to the test's fresh
``queue_db`` / ``cache_db`` (fixtures of tests/conftest.py), once per label of ``LABELS``; a test
for one label only: ``@pytest.mark.parametrize("deployment_session", ["2023"], indirect=True)``.
A label that is not set up skips with the command that sets it up, but in CI (``CI`` set), where it fails: there,
only an era whose pins the package registry did not provide skips, saying so.
"""

from __future__ import annotations

import os

import pytest

from tests.deployment_client import LABELS, DeploymentClient, missing_reason, registry_failure


def skip_or_fail_unless_ready(label: str) -> None:
    """Nothing when the label is ready; else a skip saying why, or in CI a failure (but for the registry's)."""
    reason = missing_reason(label)
    if reason is None:
        return
    if os.environ.get("CI") and registry_failure(label) is None:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session", params=LABELS)
def deployment_session(request: pytest.FixtureRequest):
    """One driver process per label for the whole session (the current libcommon imports in ~3 s)."""
    label = request.param
    skip_or_fail_unless_ready(label)  # before the server starts: a machine without the caches pays nothing
    mongo_url = request.getfixturevalue("mongo_url")
    client = DeploymentClient(label, mongo_url, queue_db="deployment_idle_queue", cache_db="deployment_idle_cache")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def deployment(deployment_session: DeploymentClient, queue_db, cache_db) -> DeploymentClient:
    deployment_session.use(queue_db.name, cache_db.name)
    return deployment_session
