"""The core the sensors and checks call: stale state, queue snapshot, scrubbing, the webhook POST."""

import datetime as dt
import http.server
import threading
import time

from zombie_pipeline import monitoring
from zombie_pipeline.documents import Status
from zombie_pipeline.embedded import free_port
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.simulate import job_document, utc_now

POLICY = ZombiePolicy()


def ago(seconds: float) -> dt.datetime:
    return utc_now() - dt.timedelta(seconds=seconds)


def crashed(dataset: str) -> dict:
    return job_document(dataset=dataset, started_at=ago(900), last_heartbeat=ago(800))


def test_the_stale_state_depends_on_the_set_of_stale_jobs_only(store):
    jobs = [crashed(f"user/{i}") for i in range(3)]
    store.jobs.insert_many(jobs)
    first = monitoring.stale_state(store.jobs, POLICY, utc_now())
    store.jobs.insert_one(job_document(dataset="user/alive", started_at=ago(60), last_heartbeat=ago(10)))
    store.jobs.insert_one(job_document(dataset="user/done", status=Status.SUCCESS, started_at=ago(900), finished_at=ago(800)))
    assert monitoring.stale_state(store.jobs, POLICY, utc_now() + dt.timedelta(seconds=5)) == first
    assert first.count == 3 and first.run_key.startswith("stale-3-")

    store.jobs.update_one({"_id": jobs[0]["_id"]}, {"$set": {"status": Status.ERROR}})
    assert monitoring.stale_state(store.jobs, POLICY, utc_now()).run_key != first.run_key


def test_no_stale_job_is_a_count_and_nothing_more(store):
    assert monitoring.stale_state(store.jobs, POLICY, utc_now()) == monitoring.StaleState(0)


def test_the_queue_snapshot_counts_what_an_operator_plots(store):
    store.jobs.insert_many(
        [crashed("user/a"), job_document(dataset="user/b", started_at=ago(60), last_heartbeat=ago(10)), job_document(status=Status.WAITING)]
    )
    snapshot = monitoring.queue_snapshot(store, POLICY, utc_now())
    assert (snapshot.started, snapshot.waiting, snapshot.stale) == (2, 1, 1)
    assert (snapshot.unfinished_finalizations, snapshot.zombies_finalized_last_24h) == (0, 0)


def test_scrub_masks_known_credentials_and_any_userinfo():
    url = "mongodb://admin:p%40ss@db.example:27017/?authSource=admin"
    text = f"cannot connect to {url}; also tried mongodb+srv://bob:hunter2@other.example and p@ss"
    scrubbed = monitoring.scrub(text, [url])
    for secret in ("p%40ss", "p@ss", "hunter2", "admin:", "bob:"):
        assert secret not in scrubbed
    assert "db.example:27017" in scrubbed and "other.example" in scrubbed


class _Slow(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        time.sleep(3)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_webhook_post_that_fails_or_hangs_is_an_outcome_not_an_exception():
    assert monitoring.post_json(None, {}, 1) == monitoring.WEBHOOK_NOT_CONFIGURED
    refused = monitoring.post_json(f"http://127.0.0.1:{free_port()}/t0ken", {"a": 1}, 1)
    assert refused.startswith("failed:") and "t0ken" not in refused
    assert monitoring.post_json("not a url", {}, 1).startswith("failed:")

    server = http.server.HTTPServer(("127.0.0.1", 0), _Slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        outcome = monitoring.post_json(f"http://127.0.0.1:{server.server_port}/", {}, 0.5)
        assert outcome.startswith("failed:") and time.monotonic() - started < 2.5
    finally:
        server.shutdown()
        server.server_close()


def test_a_failure_record_says_what_failed_in_one_line():
    record = monitoring.FailureRecord(
        run_id="r1", job_name="kill_zombies_job", failed_at=utc_now(), message="brake engaged", partition_key="/splits", failed_steps=("find_zombies",)
    )
    line = record.log_line()
    for part in ("FAILED", "kill_zombies_job", "'/splits'", "r1", "find_zombies", "brake engaged"):
        assert part in line
    assert record.payload()["text"] == line
    assert record.document("sent (HTTP 200)")["_id"] == "r1"
