"""Durations read from the cache where the queue deletes finished jobs (``statistics/cache_source.py``)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pytest
from bson import Decimal128, Int64

from tests.helpers import logged_store
from tests.statistics.builders import DAY, NEXT_DAY, NOON, event, job
from zombie_pipeline.cleanup.detection import query_plan_of
from zombie_pipeline.queue.cache import HTTP_OK, Cache, ErrorCode
from zombie_pipeline.queue.cache_entries import DETAIL_JOB_ID
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.indexes import CACHE_UPDATED_INDEX
from zombie_pipeline.queue.jobs import Status
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.statistics.cache_source import CacheIndexMissing, read_cache_period
from zombie_pipeline.statistics.sources import read_history
from zombie_pipeline.statistics.tallies import BadData

INDEX_NAME = CACHE_UPDATED_INDEX.full_name

KIND_UPDATED = [(Cache.KIND, 1), (Cache.UPDATED_AT, 1), (Cache.DATASET, 1)]


#: Stands for a field the entry does not have.
ABSENT = object()


def entry(kind, dataset: str, duration, http_status=HTTP_OK, error_code: Any = None, updated_at=NOON, **fields) -> dict:
    """A cache entry holding the values given; a field given ``ABSENT`` is left out."""
    document = {
        Cache.KIND: kind,
        Cache.DATASET: dataset,
        Cache.HTTP_STATUS: http_status,
        Cache.CONTENT: {},
        Cache.UPDATED_AT: updated_at,
    }
    document[Cache.DURATION] = duration
    if error_code is not None:
        document[Cache.ERROR_CODE] = error_code
    document.update(fields)
    return {name: value for name, value in document.items() if value is not ABSENT}


@pytest.fixture
def cache(store):
    store.cache.create_index(KIND_UPDATED, name=INDEX_NAME)
    return store.cache


def test_each_artifacts_latest_run_of_the_day_counts_once_by_its_outcome(store, cache):
    cache.insert_many(
        [entry("split-first-rows", f"u/d{i}", 10.0 + i) for i in range(5)]
        + [entry("split-first-rows", "u/failed", 30.0, http_status=500, error_code="UnexpectedError")]
        + [
            entry("config-parquet", "u/p", 600.5),
            entry("config-parquet", "u/yesterday", 1.0, updated_at=DAY - dt.timedelta(hours=1)),
        ]
    )

    period = read_cache_period(cache, store.events, DAY, NEXT_DAY)

    rows = period.tallies["split-first-rows"]
    assert period.source == "cache" and period.jobs_read == 7
    assert sorted(rows.success.tolist()) == [10.0, 11.0, 12.0, 13.0, 14.0] and rows.error.tolist() == [30.0]
    assert rows.statuses == {Status.SUCCESS: 5, Status.ERROR: 1} and rows.started == 6
    assert period.tallies["config-parquet"].success.tolist() == [600.5]  # yesterday's entry is yesterday's


def test_our_own_error_entries_count_from_their_events_and_the_deployments_kills_from_the_cache(store, cache):
    zombie = job("split-first-rows", Status.ERROR, 1_300)
    store.events.insert_one(event(zombie, Reason.EXCEEDED_MAX_DURATION))
    cache.insert_many(
        [
            entry(
                "split-first-rows",
                "u/ours",
                1_300.0,
                501,
                ErrorCode.EXCEEDED_MAX_DURATION,
                **{Cache.DETAILS: {DETAIL_JOB_ID: str(zombie["_id"])}},
            ),
            entry(
                "split-first-rows",
                "u/killed",
                1_250.0,
                501,
                ErrorCode.EXCEEDED_MAX_DURATION,
                **{Cache.DETAILS: {"error": "x"}},
            ),
            entry("split-first-rows", "u/crashed", 42.0, 501, ErrorCode.CRASHED),
        ]
    )

    rows = read_cache_period(cache, store.events, DAY, NEXT_DAY).tallies["split-first-rows"]

    assert sorted(rows.stopped.tolist()) == [1_250.0, 1_300.0]  # ours from its event, the deployment's from its entry
    assert rows.zombies == {Reason.EXCEEDED_MAX_DURATION: 2, Reason.MISSING_HEARTBEAT: 1}
    assert rows.error.tolist() == [] and rows.success.tolist() == []  # a kill is not a run's duration


def test_entries_without_a_usable_duration_or_status_are_counted_by_their_reason(store, cache):
    cache.insert_many(
        [
            entry("a", "u/ok", 1.0),
            entry("a", "u/old", ABSENT),  # written before 2024-07
            entry("a", "u/negative", -3.0),
            entry("b", "u/ok", 2.0),
            entry("b", "u/text", "12 s"),  # a value that does not fit the column: this kind is read entry by entry
        ]
    )

    period = read_cache_period(cache, store.events, DAY, NEXT_DAY)

    assert period.bad_data == {BadData.MISSING_DURATION: 1, BadData.INVALID_DURATION: 2}
    assert period.tallies["a"].success.tolist() == [1.0] and period.tallies["b"].success.tolist() == [2.0]


def test_without_the_kind_updated_index_the_read_is_refused_never_a_scan(store):
    store.cache.insert_one(entry("a", "u/d", 1.0))

    with pytest.raises(CacheIndexMissing, match="createIndex"):
        read_cache_period(store.cache, store.events, DAY, NEXT_DAY)
    assert INDEX_NAME not in store.cache.index_information()

    period = read_cache_period(store.cache, store.events, DAY, NEXT_DAY, create_index=True)  # the operator asked for it
    assert INDEX_NAME in store.cache.index_information() and period.tallies["a"].success.tolist() == [1.0]


def test_where_finished_jobs_are_deleted_the_history_is_the_cache(store, cache):
    cache.insert_one(entry("a", "u/d", 5.0))
    store.jobs.insert_one(job("a", Status.SUCCESS, 99))  # a kept-jobs shape: ignored by a deleting generation

    assert read_history(store, QUEUE_GENERATIONS["2026-05"], DAY, NEXT_DAY).tallies["a"].success.tolist() == [5.0]
    assert read_history(store, QUEUE_GENERATIONS["2023-01"], DAY, NEXT_DAY).tallies["a"].success.tolist() == [99.0]


# --- every odd value counted once, the same way ------------------------------------------------------------

#: Durations no tally can hold, each with the one reason it is counted by.
ODD_DURATIONS = {
    "NaN": (float("nan"), BadData.INVALID_DURATION),
    "a decimal NaN": (Decimal128("NaN"), BadData.INVALID_DURATION),
    "infinity": (float("inf"), BadData.INVALID_DURATION),
    "minus infinity": (float("-inf"), BadData.INVALID_DURATION),
    "negative": (-3.0, BadData.INVALID_DURATION),
    "beyond a float32": (1e300, BadData.INVALID_DURATION),
    "true": (True, BadData.INVALID_DURATION),
    "false": (False, BadData.INVALID_DURATION),
    "a string": ("12 s", BadData.INVALID_DURATION),
    "an array": ([12.0], BadData.INVALID_DURATION),
    "a document": ({"seconds": 12}, BadData.INVALID_DURATION),
    "a date": (NOON, BadData.INVALID_DURATION),
    "null": (None, BadData.MISSING_DURATION),
    "absent": (ABSENT, BadData.MISSING_DURATION),  # written before 2024-07
}
#: Numbers of seconds of every BSON number type, and what they count as.
USABLE_DURATIONS = {
    "an int": (12, 12.0),
    "a long": (Int64(40), 40.0),
    "a decimal": (Decimal128("2.5"), 2.5),
    "zero": (0.0, 0.0),
}
#: Statuses that are not an integer, with a usable duration.
ODD_STATUSES = {"absent": ABSENT, "null": None, "true": True, "a double": 200.0, "a string": "200", "an array": [200]}


def read_alone_and_mixed(store, cache, odd: dict[str, dict]) -> tuple:
    """Each odd entry alone in a kind of its own beside a usable entry (one day), then all in one kind (the next)."""
    alone = [dict(document, **{Cache.KIND: f"alone-{index}"}) for index, document in enumerate(odd.values())]
    alone += [entry(f"alone-{index}", "u/usable", 7.0) for index in range(len(odd))]
    later = NOON + dt.timedelta(days=1)
    mixed = [dict(document, **{Cache.KIND: "mixed", Cache.UPDATED_AT: later}) for document in odd.values()]
    mixed.append(entry("mixed", "u/usable", 7.0, updated_at=later))
    cache.insert_many(alone + mixed)
    return (
        read_cache_period(cache, store.events, DAY, NEXT_DAY),
        read_cache_period(cache, store.events, NEXT_DAY, NEXT_DAY + dt.timedelta(days=1)),
    )


def test_each_odd_duration_counts_by_one_reason_alone_or_beside_every_other(store, cache):
    odd = {name: entry("any", f"u/{name}", value) for name, (value, _) in ODD_DURATIONS.items()}

    alone, mixed = read_alone_and_mixed(store, cache, odd)

    expected = Counter(reason for _, reason in ODD_DURATIONS.values())
    assert expected == {BadData.INVALID_DURATION: 12, BadData.MISSING_DURATION: 2}
    assert alone.bad_data == mixed.bad_data == expected
    assert (alone.jobs_read, mixed.jobs_read) == (2 * len(odd), len(odd) + 1)  # each odd entry and the usable ones
    assert mixed.tallies["mixed"].success.tolist() == [7.0] and mixed.tallies["mixed"].statuses == {Status.SUCCESS: 1}
    assert sum(tally.started for tally in alone.tallies.values()) == len(odd)  # the usable entries only


def test_a_duration_of_any_bson_number_type_counts_as_its_seconds_beside_odd_ones(store, cache):
    odd = {
        name: entry("any", f"u/{name}", ODD_DURATIONS[name][0]) for name in ("NaN", "true", "a string", "a decimal NaN")
    }
    odd |= {name: entry("any", f"u/{name}", value) for name, (value, _) in USABLE_DURATIONS.items()}

    alone, mixed = read_alone_and_mixed(store, cache, odd)

    assert alone.bad_data == mixed.bad_data == {BadData.INVALID_DURATION: 4}
    usable = sorted(seconds for _, seconds in USABLE_DURATIONS.values())
    assert sorted(mixed.tallies["mixed"].success.tolist()) == sorted(usable + [7.0])
    assert sorted(second for tally in alone.tallies.values() for second in tally.success.tolist()) == sorted(
        usable + [7.0] * 8
    )


def test_a_status_that_is_not_an_integer_counts_once_and_a_duration_problem_comes_first(store, cache):
    odd = {name: entry("any", f"u/{name}", 5.0, http_status=status) for name, status in ODD_STATUSES.items()}
    odd["NaN and a string status"] = entry("any", "u/both", float("nan"), http_status="500")
    odd["absent duration and status"] = entry("any", "u/neither", ABSENT, http_status=ABSENT)
    odd["a long status"] = entry("any", "u/long", 9.0, http_status=Int64(500))  # an integer: an error run

    alone, mixed = read_alone_and_mixed(store, cache, odd)

    expected = {BadData.INVALID_HTTP_STATUS: 6, BadData.INVALID_DURATION: 1, BadData.MISSING_DURATION: 1}
    assert alone.bad_data == mixed.bad_data == expected
    assert mixed.tallies["mixed"].error.tolist() == [9.0] and mixed.tallies["mixed"].success.tolist() == [7.0]


def test_an_error_code_or_job_id_of_an_odd_type_is_not_a_kill_nor_ours_and_never_a_crash(store, cache):
    cache.insert_many(
        [
            entry("a", "u/list-code", 30.0, http_status=500, error_code=[ErrorCode.CRASHED]),
            entry(
                "a",
                "u/number-id",
                40.0,
                http_status=500,
                error_code="Unexpected",
                **{Cache.DETAILS: {DETAIL_JOB_ID: 12}},
            ),
            entry("a", "u/null-id", 50.0, http_status=500, **{Cache.DETAILS: {DETAIL_JOB_ID: None}}),
            entry("a", "u/listed-details", 60.0, http_status=500, **{Cache.DETAILS: [{DETAIL_JOB_ID: "x"}]}),
        ]
    )

    rows = read_cache_period(cache, store.events, DAY, NEXT_DAY).tallies["a"]

    assert sorted(rows.error.tolist()) == [30.0, 40.0, 50.0, 60.0]  # the deployment's runs, each with its duration
    assert rows.zombies == {} and rows.statuses == {Status.ERROR: 4}


#: Kinds that are not a job type; each such entry is counted once, as invalid_type.
ODD_KINDS = {
    "absent": ABSENT,
    "null": None,
    "a number": 7,
    "a boolean": False,
    "empty": "",
    "a $ prefix": "$where",
    "a dot": "config.parquet",
    "a control character": "split\nrows",
    "a document": {"name": "a"},
    "an array of two job types": ["a", "b"],
    "an array of a job type and a number": ["b", 3],
    "an array holding null": [None, "a"],
}


def test_an_entry_without_a_job_type_is_counted_once_in_its_day_whatever_its_kind_holds(store, cache):
    cache.insert_many(
        [entry(kind, f"u/{name}", 1.0) for name, kind in ODD_KINDS.items()]
        + [
            entry(kind, f"u/{name}-yesterday", 1.0, updated_at=DAY - dt.timedelta(hours=1))
            for name, kind in ODD_KINDS.items()
        ]
        + [entry("a", "u/a", 2.0), entry("b", "u/b", 3.0)]
    )

    period = read_cache_period(cache, store.events, DAY, NEXT_DAY)

    assert period.bad_data == {
        BadData.INVALID_TYPE: len(ODD_KINDS)
    }  # an array's entry too, though two kinds' queries match it
    assert period.jobs_read == len(ODD_KINDS) + 2
    assert {kind: tally.success.tolist() for kind, tally in period.tallies.items()} == {"a": [2.0], "b": [3.0]}


def test_every_query_of_a_day_examines_that_days_entries_of_one_kind_value_on_the_index(store, cache, mongo_url):
    def entries(kinds, each: int) -> list[dict]:
        return [
            entry(kind, f"u/{kind}-{i}-{day}", 1.0, updated_at=NOON + dt.timedelta(days=day))
            for kind in kinds
            for i in range(each)
            for day in (-3, 0, 3)
        ]

    cache.insert_many(entries(("a", "b"), 20) + entries((ABSENT, 7), 3))

    with logged_store(mongo_url, store) as (logged, log):
        period = read_cache_period(logged.cache, logged.events, DAY, NEXT_DAY)

    cache_name = store.cache.name
    pipelines = [command["pipeline"] for command in log.named("aggregate") if command["aggregate"] == cache_name]
    assert [pipeline[0]["$match"][Cache.KIND] for pipeline in pipelines] == ["a", "b", 7, None]
    examined = []
    for pipeline in pipelines:  # as sent: the server's planner takes the index for the first stage
        command = {"aggregate": cache_name, "pipeline": pipeline, "cursor": {}}
        plan = query_plan_of(store.cache.database.command("explain", command, verbosity="executionStats"))
        assert INDEX_NAME in str(plan["queryPlanner"]["winningPlan"])
        examined.append(plan["executionStats"]["totalDocsExamined"])
    assert examined == [20, 20, 3, 3]  # the day's entries of one kind value: never another day's, never a scan
    assert period.bad_data == {BadData.INVALID_TYPE: 6} and period.jobs_read == 46
