"""MongoDB connections: one client per URL per process, and a failure to reach one said in one clean line."""

from __future__ import annotations

import datetime as dt
import threading

import pymongo
from bson.codec_options import CodecOptions
from pymongo import MongoClient
from pymongo.database import Database

from zombie_pipeline.config import SERVER_SELECTION_TIMEOUT_ENV
from zombie_pipeline.queue.secrets import redact_url, scrub

#: How long a command waits for a server before it fails: seconds, not the minutes a dead database would hold a run.
DEFAULT_SERVER_SELECTION_TIMEOUT_MS = 5_000

_clients: dict[tuple[str, int], MongoClient] = {}
_clients_lock = threading.Lock()


def client_for(url: str, server_selection_timeout_ms: int = DEFAULT_SERVER_SELECTION_TIMEOUT_MS) -> MongoClient:
    """The process-wide client for ``url``: pymongo pools connections, so reuse it."""
    key = (url, server_selection_timeout_ms)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = MongoClient(
                url,
                tz_aware=True,
                tzinfo=dt.UTC,
                serverSelectionTimeoutMS=server_selection_timeout_ms,
                connect=False,
            )
            _clients[key] = client
        return client


def close_clients() -> None:
    """Close every cached client (tests and the CLI call this on exit)."""
    with _clients_lock:
        for client in _clients.values():
            client.close()
        _clients.clear()


def utc_codec_options() -> CodecOptions:
    return CodecOptions(tz_aware=True, tzinfo=dt.UTC)


class DatabaseUnavailable(RuntimeError):
    """The database could not be reached; the message carries no credentials, ``facts`` say where and how long."""

    def __init__(self, message: str, facts: dict[str, str | int] | None = None) -> None:
        super().__init__(message)
        self.facts = facts or {}


def check_reachable(database: Database, url: str | None, variable: str | None = None) -> None:
    """Fail fast, with one clean line naming the URL (and the variable it came from), when the server cannot be reached."""
    where = redact_url(url) + (f" (from ${variable})" if variable and url else "")
    timeout_ms = database.client.options.server_selection_timeout * 1000
    facts: dict[str, str | int] = {"url": redact_url(url), "database": database.name, "timeout_ms": round(timeout_ms)}
    if variable:
        facts["variable"] = variable
    try:
        database.client.admin.command("ping")
    except pymongo.errors.OperationFailure as error:  # reached, but refused (credentials, rights)
        raise DatabaseUnavailable(
            f"MongoDB at {where} refused the connection: {_first_words(error, url)}. Check the user, password and "
            "authSource in the URL.",
            facts,
        ) from None
    except pymongo.errors.PyMongoError as error:
        raise DatabaseUnavailable(
            f"cannot reach MongoDB at {where} within {timeout_ms / 1000:g} s: {_first_words(error, url)}. Is the server "
            f"up, and the URL right? (${SERVER_SELECTION_TIMEOUT_ENV} waits longer)",
            facts,
        ) from None


def _first_words(error: Exception, url: str | None) -> str:
    """The cause of a pymongo error without its topology dump, credentials masked."""
    text = str(error)
    for cut in (" (configured timeouts", ", Timeout:", ", full error:"):
        text = text.split(cut, 1)[0]
    return scrub(text.strip().rstrip("."), [url])
