"""``zombie-pipeline policy check``: a policy file judged as the location will judge it, and its job types against the
deployment's, with an exit status a deploy pipeline can act on."""

from __future__ import annotations

import dagster as dg
import pytest

from tests.helpers import job_document
from zombie_pipeline.app import cli
from zombie_pipeline.app.policy_check import Verdict
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    DAGSTER_HOME_ENV,
    HOME_ENV,
    POLICY_FILE_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
)
from zombie_pipeline.defs.tags import JOB_TYPE_PARTITIONS_NAME
from zombie_pipeline.queue.embedded import free_port

TYPO_AND_UNKNOWN = "max_duration_seconds_by_type:\n  splits: 2400\n  /no-such-type: 3000\n  /first-rows: 1800\n"


@pytest.fixture
def queue_env(monkeypatch, mongo_url, store, tmp_path):
    """The CLI's environment on the test's databases, the queue holding jobs of two types."""
    for variable, value in {
        QUEUE_URL_ENV: mongo_url,
        CACHE_URL_ENV: mongo_url,
        QUEUE_DATABASE_ENV: store.jobs.database.name,
        CACHE_DATABASE_ENV: store.cache.database.name,
        HOME_ENV: str(tmp_path / "home"),
    }.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv(POLICY_FILE_ENV, raising=False)
    store.jobs.insert_many([job_document(job_type="/splits"), job_document(dataset="u/b", job_type="/first-rows")])
    return store


def checked(capsys, *args: str) -> tuple[int, list[str], list[str]]:
    status = cli.main(["policy", "check", *args])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err.splitlines()


def test_every_refusal_is_a_line_of_its_own_at_once_with_the_field_a_misspelt_one_looks_like(
    queue_env, tmp_path, capsys
):
    path = tmp_path / "policy.yaml"
    path.write_text("heartbeat_timeout_seconds: 0\nmax_duration_seconds_by_typ: {}\nmax_stale_fraction: 2\n")

    status, out, err = checked(capsys, str(path))

    assert status == Verdict.REFUSED and out == []
    assert err == [
        f"zombie-pipeline: invalid zombie policy: {path}: heartbeat_timeout_seconds=0: should be greater than 0",
        f"zombie-pipeline: invalid zombie policy: {path}: max_stale_fraction=2: should be less than or equal to 1",
        f"zombie-pipeline: invalid zombie policy: {path}: max_duration_seconds_by_typ is not a policy field (did you "
        "mean max_duration_seconds_by_type?)",
    ]


def test_a_missing_file_is_said_to_be_missing(queue_env, tmp_path, capsys):
    status, _, err = checked(capsys, str(tmp_path / "absent.yaml"))

    assert status == Verdict.REFUSED
    assert err == [f"zombie-pipeline: invalid zombie policy: {tmp_path / 'absent.yaml'} does not exist"]


def test_job_types_the_queue_never_had_are_refused_with_the_one_they_look_like(queue_env, tmp_path, capsys):
    path = tmp_path / "policy.yaml"
    path.write_text(TYPO_AND_UNKNOWN)

    status, out, err = checked(capsys, str(path))

    assert status == Verdict.UNKNOWN_JOB_TYPES
    assert out[0].startswith(f"{path}: loads (sha256 ")
    assert err == [
        f"zombie-pipeline: {path}: max_duration_seconds_by_type names a job type the deployment has never had: "
        "'/no-such-type'; its setting applies to no job",
        f"zombie-pipeline: {path}: max_duration_seconds_by_type names a job type the deployment has never had: "
        "'splits' (did you mean '/splits'?); its setting applies to no job",
    ]


def test_a_policy_whose_job_types_the_queue_has_is_valid_and_the_file_of_the_environment_is_the_default(
    queue_env, tmp_path, capsys, monkeypatch
):
    path = tmp_path / "policy.yaml"
    path.write_text("max_duration_seconds_by_type:\n  /splits: 2400\ncompensation_webhooks:\n  '*': HOOK\n")
    monkeypatch.setenv(POLICY_FILE_ENV, str(path))

    status, out, err = checked(capsys)

    assert status == Verdict.VALID and err == []
    assert out[-1] == f"{path}: the 1 job type it names is known (the queue at {queue_env_where(queue_env)})"


def queue_env_where(store) -> str:
    from zombie_pipeline.queue.targets import DatabaseTargets

    return DatabaseTargets.from_env().describe()["queue"]


def test_without_a_database_the_job_types_are_checked_against_the_dagster_instances_partitions(
    tmp_path, capsys, monkeypatch
):
    closed = f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"
    monkeypatch.setenv(QUEUE_URL_ENV, closed)
    monkeypatch.setenv(CACHE_URL_ENV, closed)
    monkeypatch.setenv("ZOMBIE_MONGO_TIMEOUT_MS", "300")
    monkeypatch.setenv(DAGSTER_HOME_ENV, str(tmp_path / "dagster"))
    (tmp_path / "dagster").mkdir()
    (tmp_path / "dagster" / "dagster.yaml").write_text("")
    path = tmp_path / "policy.yaml"
    path.write_text(TYPO_AND_UNKNOWN)

    status, out, err = checked(capsys, str(path))
    assert status == Verdict.JOB_TYPES_UNCHECKED and err == []
    assert "could not be checked: cannot reach MongoDB at mongodb://127.0.0.1:" in out[-1]

    with dg.DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
        instance.add_dynamic_partitions(JOB_TYPE_PARTITIONS_NAME, ["/splits", "/first-rows"])
    status, _, err = checked(capsys, str(path))
    assert status == Verdict.UNKNOWN_JOB_TYPES
    assert [line.split(": ", 2)[2][:60] for line in err] == [
        "max_duration_seconds_by_type names a job type the deployment",
    ] * 2
    assert "'splits' (did you mean '/splits'?)" in err[1]


def test_without_a_file_the_default_policy_is_valid(queue_env, capsys):
    status, out, _ = checked(capsys)

    assert status == Verdict.VALID and "the location takes the default policy" in out[0]


def test_the_exit_statuses_are_the_ones_its_help_gives():
    described = cli.build_parser().parse_args(["policy", "check"]).command_parser.description
    for verdict, said in zip(
        Verdict,
        ("0 the policy loads", "2 the location would refuse it", "3 it names job types", "4 its job types could not"),
        strict=True,
    ):
        assert said in described and said.startswith(str(int(verdict)))
