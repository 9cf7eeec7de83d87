"""The queues between 2023 and today (2023-07, 2023-12, 2024-06), each judged by its own era's client.

dataset-viewer's ``libcommon`` of each era (tests/deployment_client/) creates, starts and heartbeats the jobs;
a worker "dies" (its dates moved back); our cleanup runs, told the generation the era's queue is. Then the
era's own code judges what we wrote: its models load every collection, its backfill (``DatasetBackfillPlan``,
with its ``CacheState``) re-runs what the cause says and nothing else, its ``Queue`` starts every waiting job,
its git-branch lock can be taken, its counters equal its recount. And the era's own worker finishing the same
dead job (``kill_as_crashed``: ``JobManager.set_crashed`` through its orchestrator), in other databases, leaves
the same failed runs, runner version and locks as our cleanup (docs/generations.md says what each era does).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from bson import ObjectId

from tests.deployment_client import ERAS, DeploymentClient
from tests.deployment_client.fixtures import deployment, deployment_session  # noqa: F401  (fixtures)
from tests.helpers import found
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.store import Store

EACH_ERA = pytest.mark.parametrize("deployment_session", ERAS, indirect=True)
KEEPS_FAILED_RUNS = ("2023-12", "2024-06")  # the cache's failed_runs arrived in 2024-01
PARQUET = "config-parquet-and-info"  # a conversion: it writes to the dataset's refs/convert/parquet branch
BRANCH = "refs/convert/parquet"


def only(*labels: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("deployment_session", labels, indirect=True)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def policy_of(client: DeploymentClient, **settings: Any) -> ZombiePolicy:
    """The policy of a cleanup in front of the era's deployment: its queue generation is the era's label."""
    return ZombiePolicy(queue_generation=client.label, **settings)


def backdate(queue_db: Any, job_id: str, **ages: dt.timedelta) -> None:
    """The job's dates moved back: a worker silent since then, as the real client cannot wait minutes."""
    at = now()
    queue_db.jobsBlue.update_one({"_id": ObjectId(job_id)}, {"$set": {name: at - age for name, age in ages.items()}})


def upsert(client: DeploymentClient, dataset: str, http_status: int, **fields: Any) -> None:
    """An entry of ``dataset``'s conversion written by the era's client (``failed_runs`` where its cache has it)."""
    if client.label not in KEEPS_FAILED_RUNS:
        fields.pop("failed_runs", None)
    content: dict[str, Any] = {"parquet_files": []} if http_status == 200 else {"error": "failed"}
    client.run(
        "upsert_response",
        kind=PARQUET,
        dataset=dataset,
        config="default",
        content=content,
        http_status=http_status,
        **fields,
    )


def a_conversion_dies(
    client: DeploymentClient,
    queue_db: Any,
    cache_db: Any,
    dataset: str,
    revision: str = "rev-2",
    previous: dict[str, Any] | None = None,
    holds_the_branch: bool = True,
) -> str:
    """``dataset``'s conversion at ``revision`` is started by the era's client, takes the dataset's branch lock and
    dies; ``previous``: the fields of the entry an earlier run left (a day ago). Another dataset's conversion
    succeeded with the step's version of the era's graph. Returns the dead job's id."""
    version = client.run("step_versions")[PARQUET]
    if queue_db.jobsBlue.count_documents({"dataset": dataset, "type": PARQUET, "status": "waiting"}) == 0:
        client.run(  # else the re-run our cleanup enqueued is started
            "create_jobs", jobs=[{"type": PARQUET, "dataset": dataset, "config": "default", "revision": revision}]
        )
    started = client.run("start_job")
    job_id = started["job_id"]
    assert started["info"]["params"]["dataset"] == dataset
    if holds_the_branch:
        assert client.run("take_branch_lock", dataset=dataset, owner=job_id)["taken"]
    upsert(client, "other/converted", 200, dataset_git_revision="r", job_runner_version=version)
    client.run(  # the dataset's configs, from the step before: what the era's backfill reads to know its artifacts
        "upsert_response",
        kind="dataset-config-names",
        dataset=dataset,
        content={"config_names": [{"dataset": dataset, "config": "default"}]},
        http_status=200,
        dataset_git_revision=revision,
        job_runner_version=client.run("step_versions")["dataset-config-names"],
    )
    if previous is not None:
        upsert(client, dataset, **previous)
        cache_db.cachedResponsesBlue.update_one(
            {"dataset": dataset, "kind": PARQUET}, {"$set": {"updated_at": now() - dt.timedelta(days=1)}}
        )
    backdate(queue_db, job_id, started_at=dt.timedelta(minutes=10), last_heartbeat=dt.timedelta(minutes=9))
    return str(job_id)


def entry_of(cache_db: Any, dataset: str) -> dict[str, Any]:
    """What the backfill and the users read of ``dataset``'s conversion entry."""
    entry = found(cache_db.cachedResponsesBlue.find_one({"dataset": dataset, "kind": PARQUET}))
    names = ("http_status", "error_code", "dataset_git_revision", "failed_runs", "job_runner_version")
    return {name: entry.get(name) for name in names}


def branch_owner(client: DeploymentClient, dataset: str) -> Any:
    key = next(key for key in client.run("state")["locks"] if dataset in key and BRANCH in key)
    return client.run("state")["locks"][key]


def verdict(client: DeploymentClient, dataset: str, revision: str = "rev-2") -> dict[str, Any]:
    """The era's backfill plan on ``dataset``'s conversion entry."""
    entries = client.run("backfill_plan", dataset=dataset, revision=revision)["entries"]
    [entry] = [row for row in entries if row["kind"] == PARQUET]
    return dict(entry)


def the_eras_own_finish(
    client: DeploymentClient, fresh_database: Any, scenario: dict[str, Any], error: str = "crashed"
) -> dict[str, Any]:
    """``scenario`` played in other databases, the dead job finished by the era's own worker code: what it left."""
    queue_db, cache_db = fresh_database(f"theirs_queue_{client.label}"), fresh_database(f"theirs_cache_{client.label}")
    ours = (client.queue_db, client.cache_db)
    client.use(queue_db.name, cache_db.name)
    try:
        job_id = a_conversion_dies(client, queue_db, cache_db, **scenario)
        client.run("kill_as_crashed", job_id=job_id, error=error)
        return {
            "job_id": job_id,
            "entry": entry_of(cache_db, scenario["dataset"]),
            "branch_owner": branch_owner(client, scenario["dataset"])
            if scenario.get("holds_the_branch", True)
            else None,
            "job": queue_db.jobsBlue.find_one({"_id": ObjectId(job_id)}, {"status": 1, "_id": 0}),
        }
    finally:
        client.use(*ours)


# --- the three things each era's own finish does -----------------------------------------------------------------


@only(*KEEPS_FAILED_RUNS)
@pytest.mark.parametrize(
    ("previous", "failed_runs"),
    [
        pytest.param(None, 0, id="a-first-entry"),
        pytest.param({"http_status": 500, "dataset_git_revision": "rev-1", "failed_runs": 2}, 0, id="another-revision"),
        pytest.param(
            {"http_status": 500, "dataset_git_revision": "rev-2", "failed_runs": 1}, 2, id="the-same-revision"
        ),
    ],
)
def test_until_2026_a_crash_counts_a_failed_run_only_after_an_entry_of_the_same_revision(
    deployment, queue_db, cache_db, fresh_database, previous, failed_runs
) -> None:
    scenario: dict[str, Any] = {"dataset": "alice/a", "previous": previous}
    theirs = the_eras_own_finish(deployment, fresh_database, scenario)
    a_conversion_dies(deployment, queue_db, cache_db, **scenario)

    run_cleanup(Store.of(queue_db, cache_db), policy_of(deployment), run_id="ours")

    assert theirs["entry"]["failed_runs"] == failed_runs
    assert entry_of(cache_db, "alice/a")["failed_runs"] == failed_runs


@EACH_ERA
def test_a_first_error_entry_carries_the_steps_version_as_the_eras_own_finish_writes_it(
    deployment, queue_db, cache_db, fresh_database
) -> None:
    scenario: dict[str, Any] = {"dataset": "alice/a", "previous": None}
    theirs = the_eras_own_finish(deployment, fresh_database, scenario)
    a_conversion_dies(deployment, queue_db, cache_db, **scenario)

    run_cleanup(Store.of(queue_db, cache_db), policy_of(deployment), run_id="ours")

    ours = entry_of(cache_db, "alice/a")
    assert ours["job_runner_version"] == theirs["entry"]["job_runner_version"]
    assert ours["job_runner_version"] == deployment.run("step_versions")[PARQUET]
    # so the era's backfill does not take it for the work of an obsolete runner (nor, in 2024, read NaN)
    judged = verdict(deployment, "alice/a")
    assert judged["verdict"] != "cache_is_job_runner_obsolete"
    assert judged["runner_version_read"] == ours["job_runner_version"]


@only("2023-07", "2023-12")
def test_the_branch_lock_of_a_conversion_that_died_is_freed_as_the_eras_finish_frees_every_lock_the_job_owns(
    deployment, queue_db, cache_db, fresh_database
) -> None:
    scenario: dict[str, Any] = {"dataset": "alice/a"}
    theirs = the_eras_own_finish(deployment, fresh_database, scenario)
    a_conversion_dies(deployment, queue_db, cache_db, **scenario)
    assert not deployment.run("take_branch_lock", dataset="alice/a", owner="the-re-run")["taken"]

    run_cleanup(Store.of(queue_db, cache_db), policy_of(deployment), run_id="ours")

    assert theirs["branch_owner"] is None
    assert branch_owner(deployment, "alice/a") is None
    assert deployment.run("take_branch_lock", dataset="alice/a", owner="the-re-run")["taken"]


@only("2024-06")
def test_from_august_2024_the_branch_lock_of_a_dead_conversion_waits_for_its_expiry_as_the_eras_finish_leaves_it(
    deployment, queue_db, cache_db, fresh_database
) -> None:
    scenario: dict[str, Any] = {"dataset": "alice/a"}
    theirs = the_eras_own_finish(deployment, fresh_database, scenario)
    zombie = a_conversion_dies(deployment, queue_db, cache_db, **scenario)

    run_cleanup(Store.of(queue_db, cache_db), policy_of(deployment), run_id="ours")

    assert theirs["branch_owner"] == theirs["job_id"]
    assert branch_owner(deployment, "alice/a") == zombie
    assert not deployment.run("take_branch_lock", dataset="alice/a", owner="the-re-run")["taken"]


# --- each era's client, after our cleanup ------------------------------------------------------------------------


@EACH_ERA
def test_after_our_cleanup_the_eras_client_loads_it_all_its_backfill_follows_the_causes_its_queue_starts_every_job(
    deployment, queue_db, cache_db
) -> None:
    store = Store.of(queue_db, cache_db)
    store.ensure_indexes()
    policy = policy_of(deployment)
    # erin/e's conversion kills its worker three times, each cleaned up: quarantined at the third
    for crash in range(3):
        if crash:  # crashes hours apart
            older = {"$set": {"updated_at": now() - dt.timedelta(hours=1)}}
            store.cache.update_many({"dataset": "erin/e", "kind": PARQUET}, older)
        a_conversion_dies(deployment, queue_db, cache_db, "erin/e", holds_the_branch=False)
        run_cleanup(store, policy, run_id=f"erin-{crash}")
    # dave/d's conversion still beats, 45 minutes in: past its maximum duration (T2: 20 minutes)
    overdue = a_conversion_dies(deployment, queue_db, cache_db, "dave/d", holds_the_branch=False)
    deployment.run("heartbeat", job_id=overdue)
    backdate(queue_db, overdue, started_at=dt.timedelta(minutes=45))
    # carol/c's conversion crashes once, holding the branch lock, after a failure of the same revision
    crashed = a_conversion_dies(
        deployment,
        queue_db,
        cache_db,
        "carol/c",
        previous={
            "http_status": 500,
            "dataset_git_revision": "rev-2",
            "failed_runs": 1,
            "error_code": "UnexpectedError",
        },
    )
    deployment.run("create_jobs", jobs=[{"type": "dataset-config-names", "dataset": "frank/f", "revision": "rev-2"}])

    report = run_cleanup(store, policy, run_id="carol-and-dave")

    assert (report.counts["cause:crash"], report.counts["cause:timeout"]) == (1, 1)
    loaded = deployment.run("load_all")
    assert loaded["ok"], loaded["errors"] or loaded["reader_errors"]
    assert deployment.run("recount_metrics")["differences"] == {}
    # the backfill: a crash below its limit is re-run where the era re-runs crashes (else by our retry), a timeout
    # is not (our retry runs it once, at +20 difficulty), a quarantine never
    retries_crashes = deployment.label in KEEPS_FAILED_RUNS
    assert verdict(deployment, "carol/c")["rerun"] is retries_crashes
    assert verdict(deployment, "dave/d")["rerun"] is False
    assert verdict(deployment, "erin/e")["rerun"] is False
    assert entry_of(cache_db, "erin/e")["job_runner_version"] == deployment.run("step_versions")[PARQUET]
    # the era's workers start every waiting job: our re-runs, and frank/f's
    waiting = {row["dataset"] for row in deployment.run("state")["jobs"] if row["status"] == "waiting"}
    started = set()
    while (job := deployment.run("start_job"))["started"]:
        started.add(job["info"]["params"]["dataset"])
    assert started == waiting
    assert waiting >= {"frank/f", "dave/d"} and "erin/e" not in waiting
    assert ("carol/c" in waiting) is not retries_crashes  # from 2023-12 the backfill re-creates a crash's job
    # carol/c's branch lock, left by its dead conversion, can be taken where the era's finish freed owned locks
    owned_freed = deployment.label != "2024-06"
    assert deployment.run("take_branch_lock", dataset="carol/c", owner="the-re-run")["taken"] is owned_freed
    if not owned_freed:
        assert branch_owner(deployment, "carol/c") == crashed
    assert deployment.run("load_all")["ok"]
    assert deployment.run("recount_metrics")["differences"] == {}
