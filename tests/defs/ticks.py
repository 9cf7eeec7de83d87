"""Sensors evaluated as the daemon would: a tick, a run status sensor's context, and a webhook that records what it
is sent (the fixtures are in ``conftest.py``)."""

import json

import dagster as dg

from tests.servers import QuietHandler
from zombie_pipeline.defs.resources import FailureWebhook, url_from_env

WEBHOOK_ENV = "ZOMBIE_TEST_FAILURE_WEBHOOK_URL"


def webhook_from_env() -> FailureWebhook:
    """The failure webhook as the deployment builds it: its URL from the environment, if set."""
    return FailureWebhook(url=url_from_env(WEBHOOK_ENV), timeout_seconds=2)


def tick(sensor, instance, resources):
    return sensor.evaluate_tick(
        dg.build_sensor_context(instance=instance, resources=resources, sensor_name=sensor.name)
    )


def status_context(instance, run_id, event_type, sensor_name, resources=None):
    [record] = instance.get_records_for_run(run_id, of_type=event_type).records
    return dg.build_run_status_sensor_context(
        sensor_name=sensor_name,
        dagster_event=record.event_log_entry.dagster_event,
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(run_id),
        resources=resources,
    )


class Webhook(QuietHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - the http.server API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Webhook.received.append((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(204)
        self.end_headers()
