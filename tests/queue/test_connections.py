"""Connections: credentials kept out of sight, one client per URL, indexes created once and never touched again."""

from __future__ import annotations

import datetime as dt
import threading
import time
from urllib.parse import quote, quote_plus, urlsplit

import pymongo
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.servers import LocalServer
from zombie_pipeline.config import MONGO_TIMEOUT_ENV
from zombie_pipeline.queue.connections import (
    DatabaseUnavailable,
    check_reachable,
    client_for,
    close_clients,
    database_error,
)
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.indexes import (
    CACHE_INDEXES,
    EVENT_INDEXES,
    INDEX_PREFIX,
    JOB_INDEXES,
    ensure_indexes,
)
from zombie_pipeline.queue.secrets import redact, redact_url, scrub, url_secrets

HOST = "db.example.com:27017"
USER = "zombie"

# --- redaction -----------------------------------------------------------------

# '*' is left out: the mask itself is made of stars, so a password of stars stays "visible".
passwords = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x2FF, blacklist_characters="*"),
    min_size=3,
    max_size=24,
)


@settings(max_examples=300, deadline=None)
@given(password=passwords, encode=st.sampled_from([quote_plus, lambda s: quote(s, safe="")]))
def test_a_percent_encoded_password_never_appears_in_redacted_output(password, encode):
    encoded = encode(password)
    url = f"mongodb://{USER}:{encoded}@{HOST}/queue?authSource=admin&tls=true"
    skeleton = (f"mongodb://{USER}:@{HOST}/queue?authSource=admin&tls=true", "auth failed for ; sent ; decoded ")
    assume(not any(password in part or encoded in part for part in skeleton))

    assert redact_url(url) == f"mongodb://***:***@{HOST}/queue"

    # pymongo decodes the userinfo with unquote_plus: both forms are secrets
    message = f"auth failed for {url}; sent {encoded}; decoded {password}"
    redacted = redact(message, [url])
    assert password not in redacted
    assert encoded not in redacted
    assert f"{USER}:" not in redacted


@pytest.mark.parametrize(
    "password",
    [
        "p@ss:w0rd",  # '@' and ':' unescaped
        "pa/ss",  # an unescaped '/' ends urlsplit's netloc early
        "pa?ss=1",
        "pa#ss",
        "a b+c%20d",
    ],
)
def test_an_unescaped_password_never_appears_either(password):
    url = f"mongodb://{USER}:{password}@{HOST}/queue"

    shown = redact_url(url)
    assert password not in shown
    assert shown.startswith("mongodb://***:***@")
    assert HOST in shown

    redacted = redact(f"cannot use {url}: password {password!r} refused", [url])
    assert password not in redacted
    assert HOST in redacted


def test_the_secrets_of_a_url_are_user_and_password_raw_and_decoded():
    url = f"mongodb://{USER}:p%40ss%2Fw+rd@{HOST}/"
    secrets = url_secrets(url)
    assert {"p%40ss%2Fw+rd", "p@ss/w+rd", "p@ss/w rd"} <= set(secrets)
    assert secrets == sorted(secrets, key=len, reverse=True)  # longest first: no partial masking
    assert url_secrets(f"mongodb://{HOST}/queue") == []
    assert url_secrets(None) == []


def test_redacting_urls_without_credentials_keeps_them_readable():
    assert redact_url(f"mongodb://{HOST}/queue?replicaSet=rs0") == f"mongodb://{HOST}/queue"
    assert redact_url("mongodb://h1:27017,h2:27017/db") == "mongodb://h1:27017,h2:27017/db"
    assert redact_url("mongodb+srv://u:secret@cluster0.example.net/") == "mongodb+srv://***:***@cluster0.example.net/"
    assert redact_url(None) == "(embedded default)"
    assert redact("nothing secret here", [None, f"mongodb://{HOST}/"]) == "nothing secret here"


def test_scrub_masks_known_credentials_and_any_userinfo():
    url = "mongodb://admin:p%40ss@db.example:27017/?authSource=admin"
    text = f"cannot connect to {url}; also tried mongodb+srv://bob:hunter2@other.example and p@ss"
    scrubbed = scrub(text, [url])
    for secret in ("p%40ss", "p@ss", "hunter2", "admin:", "bob:"):
        assert secret not in scrubbed
    assert "db.example:27017" in scrubbed and "other.example" in scrubbed


# --- reachability ------------------------------------------------------------------


def test_an_unreachable_server_raises_database_unavailable_quickly_without_the_password():
    password = "s3cr%2Ft pw"  # percent-encoded '/'
    url = f"mongodb://{USER}:{quote_plus(password)}@127.0.0.1:{free_port()}/?directConnection=true"
    database = client_for(url, timeout_ms=300)["queue"]

    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as raised:
        check_reachable(database, url)
    elapsed = time.monotonic() - started

    assert elapsed < 5
    message = str(raised.value)
    assert message.startswith("cannot reach MongoDB at mongodb://***:***@127.0.0.1:")
    for secret in (password, quote_plus(password), "s3cr/t pw", USER + ":"):
        assert secret not in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__  # no chained pymongo error


def test_a_reachable_server_passes_the_check(client, mongo_url):
    check_reachable(client["anything"], mongo_url)


# --- every wait bounded, and said in one line -------------------------------------------------------


def test_every_wait_of_a_client_is_bounded_by_its_one_timeout():
    """Connecting, choosing a server, a reply, a whole operation with its retry: pymongo's defaults bound none of
    them but the choice of a server (a stalled server held a run until its monitor gave up, some 30 s)."""
    client = client_for(f"mongodb://127.0.0.1:{free_port()}/?directConnection=true", timeout_ms=1_234)
    options = client.options
    assert options.timeout == 1.234  # timeoutMS: the operation as a whole
    assert options.server_selection_timeout == 1.234
    assert options.pool_options.connect_timeout == 1.234
    assert options.pool_options.socket_timeout == 1.234


def test_a_database_error_in_the_middle_of_a_step_is_one_line_naming_the_masked_url_the_step_and_the_setting():
    password = "s3cr%2Ft pw"
    url = f"mongodb://{USER}:{quote_plus(password)}@127.0.0.1:{free_port()}/?directConnection=true"
    with pytest.raises(pymongo.errors.PyMongoError) as raised:
        client_for(url, timeout_ms=300)["queue"]["jobs"].find_one()

    error = database_error(raised.value, "finalize_zombies: claiming and finalizing zombies", [url, url], 300)

    message = str(error)
    assert "\n" not in message
    assert message.startswith(
        "finalize_zombies: claiming and finalizing zombies: MongoDB at mongodb://***:***@127.0.0.1:"
    )
    assert "did not answer within 0.3 s (ServerSelectionTimeoutError: " in message
    assert f"${MONGO_TIMEOUT_ENV} bounds every wait on the database (300 ms)" in message
    for secret in (password, quote_plus(password), "s3cr/t pw", USER + ":"):
        assert secret not in message
    assert error.facts == {
        "url": "mongodb://***:***@127.0.0.1:" + url.rsplit(":", 1)[1].split("/")[0] + "/",
        "doing": "finalize_zombies: claiming and finalizing zombies",
        "error": "ServerSelectionTimeoutError",
        "variable": MONGO_TIMEOUT_ENV,
        "timeout_ms": 300,
    }


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (pymongo.errors.AutoReconnect("cache.example:27017: connection closed"), "lost the connection to MongoDB at "),
        (pymongo.errors.NetworkTimeout("cache.example:27017: timed out"), "did not answer within 4 s"),
        (pymongo.errors.OperationFailure("not authorized on cache", code=13), "refused a command"),
    ],
    ids=["reset", "stall", "refused"],
)
def test_each_kind_of_database_error_is_said_in_its_own_words_naming_the_url_it_came_from(error, said):
    queue_url = f"mongodb://{USER}:pw@queue.example:27017/"
    cache_url = f"mongodb://{USER}:pw@cache.example:27017/"
    message = str(database_error(error, "summarize: reading the run back", [queue_url, cache_url], 4_000))
    assert said in message
    if isinstance(error, pymongo.errors.ConnectionFailure):  # it names its host: that URL alone
        assert "mongodb://***:***@cache.example:27017/" in message and "queue.example" not in message
    else:  # it names none: both
        assert "queue.example" in message and "cache.example" in message


# --- one client per URL --------------------------------------------------------------


def test_the_client_is_one_per_url_per_process(mongo_url):
    first = client_for(mongo_url)
    assert client_for(mongo_url) is first

    other_url = mongo_url + ("&" if "?" in mongo_url else "?" if urlsplit(mongo_url).path else "/?") + "appName=threads"
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(client_for(other_url))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(client) for client in seen}) == 1
    assert seen[0] is not first  # another URL, another client


def test_closing_a_client_whose_server_is_gone_does_not_wait_out_the_operation_timeout(tmp_path):
    server = LocalServer(tmp_path).start()
    try:
        client = client_for(server.url, timeout_ms=30_000)
        client.zombie_close.jobs.insert_one({"status": "waiting"})  # a session the client will want to end
    finally:
        server.stop()

    started = time.monotonic()
    close_clients(server.url)

    assert time.monotonic() - started < 30 / 3  # the server forgets the session by itself; measured ~1.4 s
    assert client_for(server.url, timeout_ms=30_000) is not client  # closed, forgotten: a new one next time


def test_the_client_reads_dates_as_aware_utc(client, queue_db):
    moment = dt.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    queue_db["dates"].insert_one({"at": moment})
    read = client[queue_db.name]["dates"].find_one()["at"]
    assert read == moment
    assert read.utcoffset() == dt.timedelta(0)


# --- indexes -------------------------------------------------------------------------


@pytest.mark.parametrize("specs", [JOB_INDEXES, CACHE_INDEXES, EVENT_INDEXES], ids=["jobs", "cache", "events"])
def test_every_index_is_created_once(queue_db, specs):
    collection = queue_db["indexed"]

    created = ensure_indexes(collection, specs)
    assert created == [spec.full_name for spec in specs]
    after_first = collection.index_information()
    for spec in specs:
        # ours carry our prefix; one the deployment declares too has the name its models give it
        assert spec.full_name.startswith(INDEX_PREFIX) is not spec.as_deployment
        assert [(field, int(direction)) for field, direction in after_first[spec.full_name]["key"]] == list(spec.keys)
        assert spec.used_by  # each index says which query needs it

    assert ensure_indexes(collection, specs) == []
    assert collection.index_information() == after_first


def test_a_users_own_index_is_left_untouched(queue_db):
    jobs = queue_db["jobsBlue"]
    jobs.create_index([("dataset", 1), ("status", -1)], name="users_dataset_status", sparse=True)
    jobs.create_index([("unicity_id", 1)], name="users_unicity", unique=True)
    before = jobs.index_information()

    created = ensure_indexes(jobs, JOB_INDEXES)

    after = jobs.index_information()
    assert created == [spec.full_name for spec in JOB_INDEXES]
    for name in ("users_dataset_status", "users_unicity"):
        assert after[name] == before[name]
    assert after["users_dataset_status"].get("sparse") is True
    assert after["users_unicity"].get("unique") is True
    assert set(after) == set(before) | set(created)


def test_an_index_with_the_same_keys_is_reused_not_duplicated(queue_db):
    jobs = queue_db["jobsBlue"]
    # the deployment's own index on (status, started_at), under its own name
    jobs.create_index([("status", 1), ("started_at", 1)], name="status_1_started_at_1")
    before = jobs.index_information()

    created = ensure_indexes(jobs, JOB_INDEXES)

    after = jobs.index_information()
    assert "zombie_pipeline_status_started_at" not in created
    assert "zombie_pipeline_status_started_at" not in after
    assert after["status_1_started_at_1"] == before["status_1_started_at_1"]
    same_keys = [
        name
        for name, info in after.items()
        if [(f, int(d)) for f, d in info["key"]] == [("status", 1), ("started_at", 1)]
    ]
    assert same_keys == ["status_1_started_at_1"]


def test_an_index_with_the_same_fields_in_another_direction_is_not_taken_for_ours(queue_db):
    jobs = queue_db["jobsBlue"]
    jobs.create_index([("status", 1), ("started_at", -1)], name="status_1_started_at_-1")

    created = ensure_indexes(jobs, JOB_INDEXES)

    assert "zombie_pipeline_status_started_at" in created
    assert "status_1_started_at_-1" in jobs.index_information()
