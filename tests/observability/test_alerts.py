"""A failed run, told once: the record, the webhook POST that never raises, the secrets scrubbed."""

import threading
import time

from tests.servers import QuietHandler, http_server
from zombie_pipeline.observability import alerts
from zombie_pipeline.queue.audit_documents import Failure
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.jobs import ID
from zombie_pipeline.queue.times import utc_now


class _Hanging(QuietHandler):
    """Answers nothing until the test lets it go."""

    release = threading.Event()

    def do_POST(self):  # noqa: N802 - the http.server API
        self.release.wait(timeout=30)


def test_a_webhook_post_that_fails_or_hangs_is_an_outcome_not_an_exception():
    assert alerts.post_alert(None, {}, 1) == alerts.WEBHOOK_NOT_CONFIGURED
    refused = alerts.post_alert(f"http://127.0.0.1:{free_port()}/t0ken", {"a": 1}, 1)
    assert refused.startswith("failed:") and "t0ken" not in refused
    assert alerts.post_alert("not a url", {}, 1).startswith("failed:")

    _Hanging.release.clear()
    with http_server(_Hanging) as port:
        try:
            started = time.monotonic()
            outcome = alerts.post_alert(f"http://127.0.0.1:{port}/", {}, 0.5)
            assert outcome.startswith("failed:") and time.monotonic() - started < 2.5
        finally:
            _Hanging.release.set()


def test_a_failure_record_says_what_failed_in_one_line():
    record = alerts.FailureRecord(
        run_id="r1",
        job_name="kill_zombies_job",
        failed_at=utc_now(),
        message="brake engaged",
        partition_key="/splits",
        failed_steps=("find_zombies",),
    )
    line = record.log_line()
    for part in ("FAILED", "kill_zombies_job", "'/splits'", "r1", "find_zombies", "brake engaged"):
        assert part in line
    assert record.payload()["text"] == line
    assert record.document("sent (HTTP 200)")["_id"] == "r1"


def test_a_failure_is_recorded_once_per_run(store):
    record = alerts.FailureRecord(run_id="r2", job_name="kill_zombies_job", failed_at=utc_now(), message="boom")

    alerts.record_failure(store.failures, record, "not configured")
    alerts.record_failure(store.failures, record, "sent (HTTP 204)")  # a sensor tick evaluated twice

    [stored] = store.failures.find()
    assert (stored[ID], stored[Failure.MESSAGE], stored[Failure.WEBHOOK_OUTCOME]) == ("r2", "boom", "sent (HTTP 204)")
