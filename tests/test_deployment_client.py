"""The deployment's real client (dataset-viewer's libcommon at pinned commits) drives these tests.

They prove the harness itself: jobs made by the real ``Queue`` load cleanly through the real
models, and the checks do fail on what the deployment refuses (an undeclared field, a status
outside the enum, counters out of step), at each era of tests/deployment_client's ``LABELS``. A label whose
virtualenv is absent skips, saying how to set it up (``python scripts/deployment_client.py setup --all``), but in
CI, where it fails unless the package registry could not provide the era's pins.
"""

from __future__ import annotations

import datetime as dt

import pytest
from bson import ObjectId

from tests.deployment_client import ERAS, DriverError, deployment_dir
from tests.deployment_client.fixtures import deployment, deployment_session  # noqa: F401  (fixtures)

ONLY_2023 = pytest.mark.parametrize("deployment_session", ["2023"], indirect=True)
ONLY_CURRENT = pytest.mark.parametrize("deployment_session", ["current"], indirect=True)

_QUEUE_2023_07 = {"jobsBlue", "locks", "jobTotalMetric"}
_QUEUE_2024_06 = _QUEUE_2023_07 | {"workerTypeJobCounts", "pastJobs", "datasetBlockages"}
ALL_QUEUE_COLLECTIONS = {
    "2023": {"jobsBlue"},
    "2023-07": _QUEUE_2023_07,
    "2023-12": _QUEUE_2023_07 | {"workerTypeJobCounts"},
    "2024-06": _QUEUE_2024_06,
    "current": _QUEUE_2024_06,
}
ALL_CACHE_COLLECTIONS = {
    label: {"cachedResponsesBlue"} | ({"cacheTotalMetric"} if label != "2023" else set())
    for label in ALL_QUEUE_COLLECTIONS
}
#: The eras whose finished jobs stay in the queue, with their final status.
KEEPS_FINISHED_JOBS = ("2023", "2023-07")
#: (mongoengine, pymongo) each era pinned.
PINS = {
    "2023": ("0.24.2", "3.13.0"),
    "2023-07": ("0.27.0", "4.5.0"),
    "2023-12": ("0.27.0", "4.5.0"),
    "2024-06": ("0.27.0", "4.6.3"),
    "current": ("0.29.3", "4.17.0"),
}


def job(job_type: str, dataset: str, **fields) -> dict:
    # no revision: the driver gives "main" where the commit requires one (it refuses it in 2023)
    return {"type": job_type, "dataset": dataset, **fields}


def response(kind: str, dataset: str, **fields) -> dict:
    entry = {
        "kind": kind,
        "dataset": dataset,
        "content": {"ok": True},
        "http_status": 200,
        "dataset_git_revision": "rev-1",
        "job_runner_version": 1,
    }
    entry.update(fields)
    return entry


def jobs_by_id(state: dict) -> dict[str, dict]:
    return {row["id"]: row for row in state["jobs"]}


def test_the_driver_runs_the_pinned_libcommon_from_its_own_venv(deployment) -> None:
    info = deployment.run("info")
    assert info["libcommon_file"].startswith(str(deployment_dir(deployment.label) / "venv"))
    assert info["python"].startswith("3.11.")
    generation = info["generation"]
    collections = set(info["models"])
    assert collections == ALL_QUEUE_COLLECTIONS[deployment.label] | ALL_CACHE_COLLECTIONS[deployment.label]
    assert (info["mongoengine"], info["pymongo"]) == PINS[deployment.label]
    assert generation["keeps_finished_jobs"] is (deployment.label in KEEPS_FINISHED_JOBS)
    assert generation["has_locks"] is (deployment.label != "2023")
    if deployment.label == "2023":
        assert generation["statuses"] == ["waiting", "started", "success", "error", "cancelled", "skipped"]
        assert {"upsert_job", "get_zombies", "kill_zombies"} <= set(generation["queue_methods"])
    elif deployment.label == "2023-07":
        assert generation["statuses"] == ["waiting", "started", "success", "error", "cancelled"]
    else:
        assert generation["statuses"] == ["waiting", "started"]
        assert {"add_job", "create_jobs"} <= set(generation["queue_methods"])
    if deployment.label == "current":
        assert "get_stuck_jobs" in generation["queue_methods"]
    # each era's backfill rule imports (it needs networkx, environs, prometheus_client): no test falls back; so does
    # the worker's finish of 2023-07 to 2024-06 (today's needs Python 3.14)
    imports = info["imports"]
    assert ("libcommon.state" in imports) is (deployment.label != "2023")
    assert imports.get("libcommon.state") is None, imports
    if deployment.label in ERAS:
        assert imports["libcommon.orchestrator"] is None, imports


def test_jobs_made_by_the_real_client_load_cleanly(deployment) -> None:
    created = deployment.run(
        "create_jobs",
        jobs=[
            job("/splits", "alice/a"),
            job("/first-rows", "bob/b", config="default", split="train"),
            job("/splits", "carol/c"),
        ],
    )["job_ids"]
    assert len(created) == 3
    first = deployment.run("start_job")
    second = deployment.run("start_job")
    assert first["started"] and second["started"] and first["job_id"] != second["job_id"]
    deployment.run("heartbeat", job_id=second["job_id"])
    deployment.run("finish_job", job_id=first["job_id"], status="success")
    deployment.run("upsert_response", **response("/splits", "alice/a"))
    deployment.run(
        "upsert_response",
        **response(
            "/first-rows", "bob/b", config="default", split="train", http_status=500, error_code="UnexpectedError"
        ),
    )

    loaded = deployment.run("load_all")
    assert loaded["ok"], loaded["errors"] or loaded["reader_errors"]
    assert (
        set(loaded["collections"]) == ALL_QUEUE_COLLECTIONS[deployment.label] | ALL_CACHE_COLLECTIONS[deployment.label]
    )
    assert loaded["collections"]["cachedResponsesBlue"]["loaded"] == 2
    assert loaded["readers"], "the library's own readers ran"
    assert deployment.run("recount_metrics")["ok"]

    state = deployment.run("state")
    jobs = jobs_by_id(state)
    assert jobs[second["job_id"]]["status"] == "started" and "last_heartbeat" in jobs[second["job_id"]]
    if deployment.label in KEEPS_FINISHED_JOBS:
        assert jobs[first["job_id"]]["status"] == "success" and "finished_at" in jobs[first["job_id"]]
        assert state["job_status_counts"] == {"success": 1, "started": 1, "waiting": 1}
    else:  # finished jobs are deleted
        assert first["job_id"] not in jobs
        assert state["job_status_counts"] == {"started": 1, "waiting": 1}
    if deployment.label == "2023":
        assert state["locks"] is None and state["past_jobs"] is None
    else:  # a start takes (and releases) the lock of its unicity_id
        assert jobs[second["job_id"]]["unicity_id"] in state["locks"]
        metrics = deployment.run("recount_metrics")["metrics"]
        totals = {(row["job_type"], row["status"], row["total"]) for row in metrics["jobTotalMetric"]["recount"]}
        assert totals == {("/first-rows", "started", 1), ("/splits", "waiting", 1)} | (
            {("/splits", "success", 1)} if deployment.label in KEEPS_FINISHED_JOBS else set()
        )
    if state["past_jobs"] is not None:
        assert state["past_jobs"] == [] and state["blockages"] == []  # runs under 30 s are not recorded

    # an empty queue answers as the worker sees it
    while deployment.run("start_job")["started"]:
        pass
    assert deployment.run("start_job")["exception"] == "EmptyQueueError"


def test_an_undeclared_top_level_field_is_refused(deployment, queue_db, cache_db) -> None:
    job_id = deployment.run("create_jobs", jobs=[job("/splits", "alice/a")])["job_ids"][0]
    deployment.run("start_job")
    deployment.run("upsert_response", **response("/splits", "alice/a"))
    assert deployment.run("load_all")["ok"]

    queue_db.jobsBlue.update_one({"_id": ObjectId(job_id)}, {"$set": {"zombie": {"reason": "heartbeat"}}})
    cache_db.cachedResponsesBlue.update_one({"dataset": "alice/a"}, {"$set": {"zombie_note": "x"}})

    loaded = deployment.run("load_all")
    assert not loaded["ok"]
    assert loaded["error_types"]["jobsBlue"] == ["FieldDoesNotExist"]
    assert any("zombie" in message for message in loaded["errors"]["jobsBlue"])
    assert loaded["error_types"]["cachedResponsesBlue"] == ["FieldDoesNotExist"]
    bad_ids = {error.get("_id") for error in loaded["collections"]["jobsBlue"]["errors"]}
    assert job_id in bad_ids
    assert any(name.startswith("Queue.get_dump_by_pending_status") for name in loaded["reader_errors"])
    # the deployment's own stuck-job finder iterates the started jobs: it crashes too
    with pytest.raises(DriverError) as crashed:
        deployment.run("find_stuck", max_seconds_without_heartbeat=300)
    assert crashed.value.type == "FieldDoesNotExist"


def test_a_status_outside_the_enum_is_reported(deployment, queue_db) -> None:
    # "error" is a finished status in 2023 but not a status at all today
    foreign = "crashed" if deployment.label in KEEPS_FINISHED_JOBS else "error"
    job_id = deployment.run("create_jobs", jobs=[job("/splits", "alice/a")])["job_ids"][0]
    deployment.run("start_job")
    queue_db.jobsBlue.update_one({"_id": ObjectId(job_id)}, {"$set": {"status": foreign}})

    loaded = deployment.run("load_all")
    assert not loaded["ok"]
    errors = loaded["collections"]["jobsBlue"]["errors"]
    assert [(error["_id"], error["stage"], error["type"]) for error in errors] == [
        (job_id, "validate", "ValidationError")
    ]
    assert "status" in errors[0]["message"]
    if deployment.label in ("2024-06", "current"):  # and the counters no longer match the jobs
        differences = deployment.run("recount_metrics")["differences"]["jobTotalMetric"]
        assert {(row["status"], row["stored"], row["recount"]) for row in differences} == {
            ("started", 1, 0),
            ("error", None, 1),
        }


@ONLY_CURRENT
def test_counters_out_of_step_are_reported(deployment, queue_db, cache_db) -> None:
    ids = deployment.run(
        "create_jobs", jobs=[job("/splits", "alice/a", difficulty=20), job("/splits", "bob/b", difficulty=90)]
    )["job_ids"]
    deployment.run("upsert_response", **response("/splits", "alice/a"))
    assert deployment.run("recount_metrics")["ok"]

    queue_db.jobsBlue.delete_one({"_id": ObjectId(ids[1])})  # a job removed behind the library's back
    cache_db.cachedResponsesBlue.delete_many({})

    report = deployment.run("recount_metrics")
    assert not report["ok"]
    assert report["differences"]["jobTotalMetric"] == [
        {"job_type": "/splits", "status": "waiting", "dataset_status": "normal", "stored": 2, "recount": 1}
    ]
    assert report["differences"]["workerTypeJobCounts"] == [{"worker_size": "heavy", "stored": 1, "recount": 0}]
    assert report["differences"]["cacheTotalMetric"] == [
        {"kind": "/splits", "http_status": 200, "error_code": None, "stored": 1, "recount": 0}
    ]


@ONLY_2023
def test_our_cleanup_finalizes_a_zombie_that_the_2023_deployment_then_reads(deployment, queue_db, cache_db) -> None:
    from zombie_pipeline.cleanup.run import run_cleanup
    from zombie_pipeline.policy import ZombiePolicy
    from zombie_pipeline.queue.store import Store

    one_per_namespace = {"max_jobs_per_namespace": 1}  # the workers' setting at the time
    zombie_id, alive_id = deployment.run("create_jobs", jobs=[job("/splits", "alice/a"), job("/splits", "bob/b")])[
        "job_ids"
    ]
    assert deployment.run("start_job", **one_per_namespace)["job_id"] == zombie_id
    assert deployment.run("start_job", **one_per_namespace)["job_id"] == alive_id
    deployment.run("heartbeat", job_id=alive_id)
    deployment.run("create_jobs", jobs=[job("/first-rows", "alice/other", config="c", split="s")])
    # an older result of the zombie's artifact, written by the real client
    deployment.run("upsert_response", **response("/splits", "alice/a"))

    # the worker of the zombie died 9 minutes ago, 10 minutes into the job
    now = dt.datetime.now(dt.UTC)
    queue_db.jobsBlue.update_one(
        {"_id": ObjectId(zombie_id)},
        {"$set": {"started_at": now - dt.timedelta(minutes=10), "last_heartbeat": now - dt.timedelta(minutes=9)}},
    )
    cache_db.cachedResponsesBlue.update_one(
        {"dataset": "alice/a"}, {"$set": {"updated_at": now - dt.timedelta(hours=1)}}
    )
    assert [j["job_id"] for j in deployment.run("find_stuck", max_seconds_without_heartbeat=300)["jobs"]] == [zombie_id]
    blocked = deployment.run("start_job", **one_per_namespace)
    assert blocked == {"started": False, "exception": "EmptyQueueError", "message": blocked["message"]}

    store = Store.of(queue_db, cache_db)
    store.ensure_indexes()
    run_cleanup(store, ZombiePolicy(), run_id="t")

    loaded = deployment.run("load_all")
    assert loaded["ok"], loaded["errors"] or loaded["reader_errors"]
    state = deployment.run("state")
    jobs = jobs_by_id(state)
    assert jobs[zombie_id]["status"] == "error" and "finished_at" in jobs[zombie_id]
    assert jobs[alive_id]["status"] == "started"
    entry = next(row for row in state["cache"] if row["dataset"] == "alice/a")
    assert (entry["http_status"], entry["error_code"]) == (501, "JobManagerCrashedError")
    assert deployment.run("find_stuck", max_seconds_without_heartbeat=300)["jobs"] == []
    # the zombie no longer holds its namespace: the real client starts alice's next job
    unblocked = deployment.run("start_job", **one_per_namespace)
    assert unblocked["started"] and unblocked["info"]["dataset"].startswith("alice/")
