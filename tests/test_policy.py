"""The policy and the suggestion rules: validated when built, every bad field named, and what the cleanup asks of them."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest

from zombie_pipeline.policy import (
    InvalidPolicy,
    PolicyError,
    PolicySource,
    SuggestionRules,
    SuggestionSettings,
    ZombiePolicy,
    policy_from_file,
    read_policy_file,
    validated,
)
from zombie_pipeline.queue.cache import ErrorCode

#: (values, the names the message must hold, whether it is a rule across fields: "invalid zombie policy: ...")
BAD_POLICIES: list[tuple[dict[str, Any], list[str], bool]] = [
    ({"heartbeat_timeout_seconds": 0}, ["heartbeat_timeout_seconds"], False),
    ({"heartbeat_timeout_seconds": -1}, ["heartbeat_timeout_seconds"], False),
    ({"heartbeat_timeout_seconds": -300}, ["heartbeat_timeout_seconds"], False),
    ({"max_duration_seconds": 0}, ["max_duration_seconds"], False),
    ({"max_duration_seconds": -1200}, ["max_duration_seconds"], False),
    ({"max_duration_seconds": 200}, ["max_duration_seconds (200 s)", "heartbeat_timeout_seconds (300 s)"], True),
    (
        {"heartbeat_timeout_seconds": 600, "max_duration_seconds": 300},
        ["max_duration_seconds (300 s) is shorter than heartbeat_timeout_seconds"],
        True,
    ),
    ({"max_duration_seconds_by_type": {"/splits": 60}}, ["max_duration_seconds_by_type['/splits']"], True),
    ({"max_duration_seconds_by_type": {"/x": 100}}, ["max_duration_seconds_by_type['/x']"], True),
    (
        {"max_duration_seconds_by_type": {"/splits": -5}},
        ["max_duration_seconds_by_type['/splits'] must be positive"],
        True,
    ),
    (
        {"max_duration_seconds_by_type": {"": 2000}},
        ["max_duration_seconds_by_type has a job type that is not one"],
        True,
    ),
    ({"max_duration_seconds_by_type": {"a.b": 2000}}, ["max_duration_seconds_by_type", "dot"], True),
    ({"batch_size": 0}, ["batch_size"], False),
    ({"batch_size": -10}, ["batch_size"], False),
    ({"crashed_retry_limit": -1}, ["crashed_retry_limit"], False),
    ({"exceeded_retry_limit": -1}, ["exceeded_retry_limit"], False),
    ({"exceeded_retry_limit": -2}, ["exceeded_retry_limit"], False),
    ({"claim_lease_seconds": -5}, ["claim_lease_seconds"], False),
    ({"claim_lease_seconds": -60}, ["claim_lease_seconds"], False),
    ({"min_started_for_brake": -1}, ["min_started_for_brake"], False),
    ({"max_stale_fraction": 0.0}, ["max_stale_fraction"], False),
    ({"max_stale_fraction": 1.5}, ["max_stale_fraction"], False),
    ({"http_status": 200}, ["http_status"], False),
    ({"cache_generation": "1999-01"}, ["cache_generation", "'1999-01'"], True),
    ({"queue_generation": "1999-01"}, ["queue_generation", "'1999-01'"], True),
    ({"no_such_setting": 1}, ["no_such_setting"], False),
]


def case_id(case) -> str:
    return ",".join(f"{name}={value}" for name, value in case[0].items())


def assert_refused(error: PolicyError, named: list[str], across_fields: bool) -> None:
    """The message names every offending field; a rule across fields says the policy is invalid as a whole."""
    message = str(error)
    for name in named:
        assert name in message, message
    assert ("invalid zombie policy: " in message) is across_fields, message


@pytest.mark.parametrize("values, named, across_fields", BAD_POLICIES, ids=[case_id(case) for case in BAD_POLICIES])
def test_a_bad_value_is_refused_when_the_policy_is_built_with_the_field_named(values, named, across_fields):
    with pytest.raises(PolicyError) as refused:
        ZombiePolicy(**values)
    assert_refused(refused.value, named, across_fields)


def test_every_bad_field_is_named_at_once():
    with pytest.raises(PolicyError) as refused:
        ZombiePolicy(heartbeat_timeout_seconds=-1, batch_size=0, crashed_retry_limit=-1)
    assert refused.value.error_count() == 3
    assert all(
        name in str(refused.value) for name in ("heartbeat_timeout_seconds", "batch_size", "crashed_retry_limit")
    )

    with pytest.raises(PolicyError) as refused:
        ZombiePolicy(max_duration_seconds=200, max_duration_seconds_by_type={"/a": 100, "$where": 2000})
    assert all(name in str(refused.value) for name in ("max_duration_seconds (200 s)", "['/a']", "'$where'"))


def test_the_default_policy_is_valid_and_frozen():
    policy = ZombiePolicy()
    assert (policy.heartbeat_timeout_seconds, policy.max_duration_seconds, policy.use_suggested_max_durations) == (
        300,
        1200,
        False,
    )
    with pytest.raises(PolicyError):  # frozen: an assignment is refused as a validation error
        policy.batch_size = 0


def test_each_type_has_its_maximum_duration_and_each_error_code_its_retry_limit():
    policy = ZombiePolicy(max_duration_seconds_by_type={"/slow": 7200}, crashed_retry_limit=5, exceeded_retry_limit=1)

    assert (policy.max_duration_of("/slow"), policy.max_duration_of("/other")) == (7200, 1200)
    assert policy.retry_limit_of(ErrorCode.CRASHED) == 5
    assert policy.retry_limit_of(ErrorCode.EXCEEDED_MAX_DURATION) == 1


def test_maximum_durations_given_later_replace_those_of_their_types_only():
    policy = ZombiePolicy(max_duration_seconds_by_type={"/splits": 900, "/first-rows": 1800})

    changed = policy.with_max_durations({"/first-rows": 3_600, "/parquet": 600})

    assert changed.max_duration_seconds_by_type == {"/splits": 900, "/first-rows": 3_600, "/parquet": 600}
    assert changed.max_duration_of("/first-rows") == 3_600 and changed.max_duration_of("/sizes") == 1_200
    assert policy.max_duration_seconds_by_type == {"/splits": 900, "/first-rows": 1800}  # the original is unchanged


def test_the_audit_copy_of_a_policy_keeps_job_types_as_values():
    document = ZombiePolicy(max_duration_seconds_by_type={'{"$gt": ""}': 900, "/a": 600}).as_document()

    assert document["max_duration_seconds_by_type"] == [
        {"type": "/a", "seconds": 600},
        {"type": '{"$gt": ""}', "seconds": 900},
    ]
    assert document["heartbeat_timeout_seconds"] == 300


# --- the suggestion rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"quantile": 1.0},
        {"quantile": 0.2},
        {"margin": 0.9},
        {"margin": 11},
        {"min_samples": 0},
        {"confidence": 1.0},
        {"censored_fraction": 0.0},
    ],
    ids=lambda bad: ",".join(f"{name}={value}" for name, value in bad.items()),
)
def test_suggestion_rules_refuse_out_of_range_settings_naming_them(bad):
    with pytest.raises(PolicyError, match=re.escape(next(iter(bad)))):
        SuggestionRules(**bad)


def test_the_censoring_threshold_is_one_minus_the_quantile_unless_set():
    assert SuggestionRules(quantile=0.95).censoring_threshold == pytest.approx(0.05)
    assert SuggestionRules(censored_fraction=0.2).censoring_threshold == 0.2
    assert SuggestionRules(quantile=0.9).as_dict()["censored_fraction"] == pytest.approx(0.1)


def test_the_rules_are_picked_out_of_a_larger_configuration_and_checked_in_one_line():
    class Configured(SuggestionSettings):  # a Dagster config carries the rules and more
        window_days: int = 3

    assert SuggestionRules.of(Configured(quantile=0.9)) == SuggestionRules(quantile=0.9)
    with pytest.raises(InvalidPolicy, match=r"^invalid suggestion rules: quantile=2: should be less than 1$"):
        SuggestionRules.of(Configured(quantile=2.0))


# --- the policy file of a location ----------------------------------------------------------------------------


def test_a_policy_file_holds_the_settings_at_its_top_or_the_reports_snippet_pasted_whole(tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text("heartbeat_timeout_seconds: 600\nmax_duration_seconds_by_type:\n  /splits: 2400\n")
    snippet = tmp_path / "snippet.yaml"
    snippet.write_text(
        "resources:\n  zombie_policy:\n    config:\n      max_duration_seconds_by_type:\n        /splits: 2400\n"
    )

    assert policy_from_file(plain) == ZombiePolicy(
        heartbeat_timeout_seconds=600, max_duration_seconds_by_type={"/splits": 2400}
    )
    assert policy_from_file(snippet) == ZombiePolicy(max_duration_seconds_by_type={"/splits": 2400})


@pytest.mark.parametrize(
    "text, said",
    [
        ("heartbeat_timeout_seconds: 0\n", "heartbeat_timeout_seconds=0: should be greater than 0"),
        ("no_such_setting: 1\n", "no_such_setting is not a policy field"),
        ("- a list\n", "must hold a mapping of policy settings, got list"),
        ("heartbeat_timeout_seconds: [unclosed\n", "is not valid YAML"),
    ],
    ids=["a bound", "an unknown field", "not a mapping", "not YAML"],
)
def test_a_policy_file_that_cannot_be_used_is_refused_in_one_line_naming_the_file(tmp_path, text, said):
    path = tmp_path / "policy.yaml"
    path.write_text(text)

    with pytest.raises(InvalidPolicy) as refused:
        policy_from_file(path)

    message = str(refused.value)
    assert message.startswith(f"invalid zombie policy: {path}") and said in message and "\n" not in message


def test_a_missing_policy_file_is_said_to_be_missing_not_unreadable_yaml(tmp_path):
    with pytest.raises(InvalidPolicy, match=r"^invalid zombie policy: .*absent\.yaml does not exist$"):
        policy_from_file(tmp_path / "absent.yaml")
    with pytest.raises(InvalidPolicy, match=r"is a directory, not a policy file$"):
        policy_from_file(tmp_path)


def test_a_misspelt_field_is_refused_with_the_field_it_looks_like():
    with pytest.raises(InvalidPolicy) as refused:
        validated({"heartbeat_timout_seconds": 600, "max_duration_seconds_by_typ": {}, "zzz": 1})

    assert refused.value.problems == (
        "heartbeat_timout_seconds is not a policy field (did you mean heartbeat_timeout_seconds?)",
        "max_duration_seconds_by_typ is not a policy field (did you mean max_duration_seconds_by_type?)",
        "zzz is not a policy field",
    )


def test_every_refusal_of_a_file_is_a_line_of_its_own_naming_the_file(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("heartbeat_timeout_seconds: 0\nmax_stale_fraction: 7\nretry_jitter: -1\n")

    with pytest.raises(InvalidPolicy) as refused:
        read_policy_file(path)

    assert refused.value.lines() == [
        f"invalid zombie policy: {path}: heartbeat_timeout_seconds=0: should be greater than 0",
        f"invalid zombie policy: {path}: max_stale_fraction=7: should be less than or equal to 1",
        f"invalid zombie policy: {path}: retry_jitter=-1: should be greater than or equal to 0",
    ]
    assert str(refused.value) == "; ".join(refused.value.lines()).replace(f"; invalid zombie policy: {path}: ", "; ")


def test_the_rules_across_fields_are_each_a_refusal_of_their_own():
    with pytest.raises(InvalidPolicy) as refused:
        validated({"max_duration_seconds": 10, "max_duration_seconds_by_type": {"a.b": 500}})

    assert len(refused.value.problems) == 2
    assert (
        refused.value.problems[1]
        == "max_duration_seconds_by_type has a job type that is not one: type contains a dot ('a.b')"
    )


def test_a_policy_file_is_read_with_the_hash_of_its_content(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("heartbeat_timeout_seconds: 600\n")

    read = read_policy_file(path)

    assert read.sha256 == hashlib.sha256(b"heartbeat_timeout_seconds: 600\n").hexdigest()
    assert read.settings == {"heartbeat_timeout_seconds": 600}
    assert PolicySource.of(read, ["http_status"]).describe() == (
        f"file {path} (sha256 {read.sha256[:12]}), run config overrides http_status"
    )
    assert PolicySource.of(None).describe() == "default"
