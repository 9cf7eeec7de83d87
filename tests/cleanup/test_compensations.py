"""Compensations: actions per job type, run at least once after a zombie's cache entry is written, failures retried later."""

import contextlib
import json
import socket
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import ago, crashed_job
from tests.servers import QuietHandler, http_server
from zombie_pipeline.cleanup import compensations
from zombie_pipeline.cleanup.compensations import CompensationError, audit
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import CompensationEntry, CompensationState, Event
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.simulation.shapes import cache_document

TOKEN_PATH = "/hooks/s3cr3t-token"


@contextlib.contextmanager
def webhook(statuses: list[int]) -> Iterator[tuple[str, list[dict]]]:
    """A real HTTP server on 127.0.0.1 answering ``statuses`` in turn (then 200); the requests it received."""
    received: list[dict] = []

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append({"path": self.path, "key": self.headers["Idempotency-Key"], "body": body})
            self.send_response(statuses[len(received) - 1] if len(received) <= len(statuses) else 200)
            self.end_headers()

    with http_server(Handler) as port:
        yield f"http://127.0.0.1:{port}{TOKEN_PATH}", received


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}{TOKEN_PATH}"


def _entries(store) -> dict[str, dict]:
    (event,) = store.events.find()
    return {entry[CompensationEntry.NAME]: entry for entry in event[Event.COMPENSATIONS]}


def test_a_compensation_that_fails_twice_then_succeeds_runs_exactly_three_times_and_is_recorded_once_as_done(
    store, monkeypatch
):
    policy = ZombiePolicy(compensation_webhooks={"/splits": "SPLITS_HOOK"})
    job = crashed_job(job_type="/splits")
    store.jobs.insert_one(job)
    with webhook([500, 503]) as (url, received):
        monkeypatch.setenv("SPLITS_HOOK", url)
        counts = [run_cleanup(store, policy, f"run-{attempt}").counts for attempt in range(5)]
    assert len(received) == 3
    assert {request["key"] for request in received} == {str(job[ID])}  # one idempotency key for every attempt
    assert (
        received[0]["body"]["job"][Job.DATASET] == job[Job.DATASET]
        and received[0]["body"]["reason"] == Reason.MISSING_HEARTBEAT
    )
    assert [request["body"]["attempt"] for request in received] == [1, 2, 3]
    assert [count["compensation_to_retry"] for count in counts] == [1, 1, 0, 0, 0]
    assert [count["compensation_done"] for count in counts] == [0, 0, 1, 0, 0]
    (event,) = store.events.find()
    assert event[Event.COMPENSATION_STATE] == CompensationState.DONE
    entry = _entries(store)["webhook SPLITS_HOOK"]
    assert entry[CompensationEntry.STATE] == CompensationState.DONE and entry[CompensationEntry.ATTEMPTS] == 3
    assert CompensationEntry.LAST_ERROR not in entry and entry[CompensationEntry.DONE_AT] is not None
    assert audit(store).passed


def test_a_failing_action_never_stops_the_others_and_is_given_up_on_after_its_attempts(store, monkeypatch):
    policy = ZombiePolicy(
        compensation_webhooks={"/splits": "DOWN_HOOK", "*": "EVERY_HOOK"}, compensation_max_attempts=2
    )
    store.jobs.insert_many([crashed_job("user/a", "/splits"), crashed_job("user/b", "/first-rows")])
    monkeypatch.setenv("DOWN_HOOK", closed_port_url())
    with webhook([]) as (url, received):
        monkeypatch.setenv("EVERY_HOOK", url)
        first = run_cleanup(store, policy, "run-1")
        second = run_cleanup(store, policy, "run-2")
    assert first.counts["finalized"] == 2 and len(received) == 2  # both zombies' webhook ran, despite the other failing
    assert (first.counts["compensation_to_retry"], second.counts["compensation_failed"]) == (1, 1)
    failing = store.events.find_one({f"{Event.JOB}.{Job.DATASET}": "user/a"})
    assert failing[Event.COMPENSATION_STATE] == CompensationState.FAILED
    (down,) = [entry for entry in failing[Event.COMPENSATIONS] if entry[CompensationEntry.NAME] == "webhook DOWN_HOOK"]
    assert down[CompensationEntry.ATTEMPTS] == 2 and "POST http://127.0.0.1:" in down[CompensationEntry.LAST_ERROR]
    assert TOKEN_PATH not in down[CompensationEntry.LAST_ERROR]  # the path often is the webhook's secret
    result = audit(store)
    assert (result.failed, result.retrying, result.passed) == (1, 0, False)
    assert run_cleanup(store, policy, "run-3").counts["compensation_failed"] == 0  # given up on: not tried again


def test_a_webhook_whose_variable_is_unset_fails_with_its_name_and_no_zombie_without_an_action_is_marked(
    store, monkeypatch
):
    monkeypatch.delenv("UNSET_HOOK", raising=False)
    policy = ZombiePolicy(compensation_webhooks={"/splits": "UNSET_HOOK"})
    store.jobs.insert_many([crashed_job("user/a", "/splits"), crashed_job("user/b", "/first-rows")])
    run_cleanup(store, policy, "run-1")
    marked = store.events.find_one({f"{Event.JOB}.{Job.DATASET}": "user/a"})
    assert "$UNSET_HOOK is not set" in marked[Event.COMPENSATIONS][0][CompensationEntry.LAST_ERROR]
    assert Event.COMPENSATION_STATE not in store.events.find_one({f"{Event.JOB}.{Job.DATASET}": "user/b"})


# --- actions registered by installed packages ---------------------------------------------------------


@pytest.fixture
def installed_package(tmp_path: Path, monkeypatch) -> Iterator[Callable[[str, str], Path]]:
    """A package installed in a directory on ``sys.path``, with its dist-info declaring our entry point group."""

    def install(module: str, target: str) -> Path:
        (tmp_path / f"{module}.py").write_text(
            textwrap.dedent(
                """
                import json
                from pathlib import Path

                class RecordCompensation:
                    name = "record"

                    def applies_to(self, job_type):
                        return job_type == "/splits"

                    def run(self, context):
                        with (Path(__file__).parent / "ran.jsonl").open("a") as ran:
                            ran.write(json.dumps({"job_id": str(context.job_id), "revision": (context.previous_entry or {}).get("dataset_git_revision")}) + "\\n")
                """
            )
        )
        info = tmp_path / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[{compensations.ENTRY_POINT_GROUP}]\nrecord = {target}\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        compensations.installed.cache_clear()
        return tmp_path / "ran.jsonl"

    yield install
    compensations.installed.cache_clear()


def test_an_action_registered_through_an_entry_point_is_found_and_run(store, installed_package):
    ran = installed_package("zp_test_compensation", "zp_test_compensation:RecordCompensation")
    job = crashed_job(job_type="/splits")
    store.jobs.insert_many([job, crashed_job("user/other", "/first-rows")])
    store.cache.insert_one(
        cache_document({**job, Job.REVISION: "c0ffee"}, ago(86_400))
    )  # the last successful run's commit
    report = run_cleanup(store, ZombiePolicy(), "run-1")
    assert report.counts["compensation_done"] == 1  # only the type it applies to
    assert [json.loads(line) for line in ran.read_text().splitlines()] == [
        {"job_id": str(job[ID]), "revision": "c0ffee"}
    ]
    assert store.events.find_one({ID: job[ID]})[Event.COMPENSATION_STATE] == CompensationState.DONE


def test_a_broken_entry_point_is_refused_before_anything_is_written(store, installed_package):
    installed_package("zp_broken_compensation", "zp_broken_compensation:NoSuchThing")
    store.jobs.insert_one(crashed_job())
    with pytest.raises(CompensationError, match="zp_broken_compensation:NoSuchThing"):
        run_cleanup(store, ZombiePolicy(), "run-1")
    assert store.events.count_documents({}) == 0 and store.jobs.find_one()[Job.STATUS] == Status.STARTED
