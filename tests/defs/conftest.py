"""The sensors' tests' resources (as the deployment builds them from the environment), an instance, and a webhook;
a module that needs others defines its own."""

import dagster as dg
import pytest

from tests.defs.ticks import WEBHOOK_ENV, Webhook, webhook_from_env
from tests.helpers import METRICS_OFF, databases_from_env
from tests.servers import http_server
from zombie_pipeline.config import CACHE_URL_ENV, QUEUE_URL_ENV
from zombie_pipeline.defs.resources import ZombiePolicyResource


@pytest.fixture
def resources(mongo_url, queue_db, cache_db, monkeypatch):
    monkeypatch.setenv(QUEUE_URL_ENV, mongo_url)
    monkeypatch.setenv(CACHE_URL_ENV, mongo_url)
    monkeypatch.delenv(WEBHOOK_ENV, raising=False)
    return {
        "databases": databases_from_env(queue_db.name, cache_db.name),
        "zombie_policy": ZombiePolicyResource(),
        "failure_webhook": webhook_from_env(),
        **METRICS_OFF,
    }


@pytest.fixture
def instance():
    """In memory: runs, event logs and dynamic partitions as the daemon's instance keeps them."""
    return dg.DagsterInstance.ephemeral()


@pytest.fixture
def webhook():
    Webhook.received = []
    with http_server(Webhook) as port:
        yield f"http://127.0.0.1:{port}/hooks/t0ken", Webhook.received
