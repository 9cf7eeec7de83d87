"""A failed run of the pipeline, told once: logged, recorded beside the queue, POSTed to a webhook.

Every message is scrubbed of credentials before it leaves (``queue.secrets.scrub``, by the sensor); the webhook's
own URL never appears beyond its scheme and host (``webhooks``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pymongo.collection import Collection

from zombie_pipeline.observability import webhooks
from zombie_pipeline.queue.audit_documents import Failure
from zombie_pipeline.queue.jobs import ID


@dataclass(frozen=True)
class FailureRecord:
    """A failed run of the pipeline, as the failure sensor reports it everywhere."""

    run_id: str
    job_name: str
    failed_at: dt.datetime
    message: str
    partition_key: str | None = None
    failed_steps: tuple[str, ...] = ()
    will_retry: bool = False  # Dagster's run retries start it again (dagster/max_retries)

    def log_line(self) -> str:
        partition = f" partition {self.partition_key!r}" if self.partition_key else ""
        steps = f" (failed steps: {', '.join(self.failed_steps)})" if self.failed_steps else ""
        retried = " (retried by Dagster)" if self.will_retry else ""
        return (
            f"zombie-pipeline run FAILED{retried}: job {self.job_name}{partition}, run {self.run_id}{steps}: "
            f"{self.message}"
        )

    def document(self, webhook_outcome: str) -> dict[str, Any]:
        return {
            ID: self.run_id,
            Failure.JOB_NAME: self.job_name,
            Failure.PARTITION_KEY: self.partition_key,
            Failure.FAILED_AT: self.failed_at,
            Failure.MESSAGE: self.message,
            Failure.FAILED_STEPS: list(self.failed_steps),
            Failure.WILL_RETRY: self.will_retry,
            Failure.WEBHOOK_OUTCOME: webhook_outcome,
        }

    def payload(self) -> dict[str, Any]:
        """The webhook body; ``text`` is what chat incoming-webhooks (Slack, Mattermost) display."""
        return {
            "text": self.log_line(),
            "run_id": self.run_id,
            Failure.JOB_NAME: self.job_name,
            Failure.PARTITION_KEY: self.partition_key,
            Failure.FAILED_AT: self.failed_at.isoformat(),
            Failure.MESSAGE: self.message,
            Failure.FAILED_STEPS: list(self.failed_steps),
            Failure.WILL_RETRY: self.will_retry,
        }


def record_failure(failures: Collection[Any], record: FailureRecord, webhook_outcome: str) -> None:
    """Upsert by run id: a sensor tick evaluated twice leaves one document."""
    failures.replace_one({ID: record.run_id}, record.document(webhook_outcome), upsert=True)


WEBHOOK_NOT_CONFIGURED = "not configured"


def post_alert(url: str | None, payload: Mapping[str, Any], timeout_seconds: float) -> str:
    """POST ``payload`` (``webhooks.post_json``); the outcome as text, never an exception: an alert must not fail
    the sensor that sends it."""
    if not url:
        return WEBHOOK_NOT_CONFIGURED
    try:
        status = webhooks.post_json(url, payload, timeout_seconds)
    except webhooks.WebhookError as error:
        return f"failed: {error}"
    return f"sent (HTTP {status})"
