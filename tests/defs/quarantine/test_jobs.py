"""``lift_quarantine_job``: an operator lifts a quarantine from the Launchpad, in process against the test server."""

from __future__ import annotations

import datetime as dt
from typing import Any

import dagster as dg
import pytest

from tests.cleanup.test_causes import deployment
from tests.cleanup.test_quarantine import POISON, TYPE, crash, poison_waiting
from tests.helpers import QUIET_LOGGERS, database_resources, step_metadata
from zombie_pipeline.definitions import defs
from zombie_pipeline.defs.quarantine.jobs import lift_quarantine_job
from zombie_pipeline.defs.resources import ZombiePolicyResource
from zombie_pipeline.queue.audit_documents import Quarantine
from zombie_pipeline.queue.times import truncate_ms, utc_now

URL_ENV = "ZOMBIE_QUARANTINE_TEST_MONGO_URL"


@pytest.fixture
def resources(mongo_url, store, monkeypatch) -> dict[str, Any]:
    monkeypatch.setenv(URL_ENV, mongo_url)
    return {**database_resources(store, URL_ENV), "zombie_policy": ZombiePolicyResource()}


def run_lift(resources: dict[str, Any], **config: str) -> dg.ExecuteInProcessResult:
    return lift_quarantine_job.execute_in_process(
        run_config={"ops": {"lift_quarantine": {"config": config}}, "loggers": QUIET_LOGGERS},
        resources=resources,
        raise_on_error=False,
    )


def test_the_location_has_the_lift_job():
    assert defs.resolve_job_def(lift_quarantine_job.name).name == "lift_quarantine_job"


def test_an_operator_lifts_a_quarantine_and_its_withheld_job_runs_again(store, resources):
    policy = deployment(store, "2026-05")
    first = truncate_ms(utc_now() - dt.timedelta(hours=41))
    for hours in (0, 20, 40):  # quarantined an hour ago
        crash(store, policy, "2026-05", first + dt.timedelta(hours=hours))
    assert poison_waiting(store) == []

    result = run_lift(resources, dataset=POISON, job_type=TYPE)

    assert result.success
    metadata = step_metadata(result, "lift_quarantine")
    assert (metadata["withheld_jobs_rerun"], metadata["enqueued"], metadata["already_queued"]) == (1, 1, 0)
    assert len(poison_waiting(store)) == 1
    assert store.quarantine.count_documents({Quarantine.LIFTED_AT: None}) == 0


def test_lifting_a_pair_that_is_not_quarantined_fails_in_one_line_and_is_not_retried(store, resources):
    deployment(store, "2026-05")
    result = run_lift(resources, dataset="user/fine", job_type=TYPE)

    assert not result.success
    [failure] = [
        event.step_failure_data.user_failure_data
        for event in result.all_events
        if event.is_step_failure and event.step_failure_data.user_failure_data is not None
    ]
    assert failure.description == "user/fine /first-rows is not quarantined; quarantined now: none"
    assert len([event for event in result.all_events if event.is_step_failure]) == 1  # never retried
