"""MongoDB connections: one client per URL per process, every wait bounded by one setting, and a failure said in one line.

A database that stops answering must fail a run within ``$ZOMBIE_MONGO_TIMEOUT_MS``,
not after whatever pymongo's defaults allow (no socket timeout at all: a stalled
server held a cleanup until the client's monitor gave up, some 30 s later). So
:func:`client_for` bounds connecting, choosing a server, each read of a socket,
and each whole operation with its retries (pymongo's client-side operation
timeout, ``timeoutMS``) by that one value. An error in the middle of a step
becomes one line (:func:`database_error`): the masked URL, what was being done,
and the setting that bounds the wait.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pymongo
from pymongo import MongoClient
from pymongo.database import Database

from zombie_pipeline.config import MONGO_TIMEOUT_ENV
from zombie_pipeline.queue.secrets import redact_url, scrub

#: How long any wait on a database may last before the run fails: seconds, not the minutes a dead or stalled
#: database would hold a run. The longest single command of a cleanup of 1,000 zombies in batches of 500 took
#: 0.9 s on the embedded server under load (docs/reliability.md): five times that leaves room.
DEFAULT_TIMEOUT_MS = 5_000
#: The same bound for the embedded server, which shares the machine with whatever else runs there: beside four
#: CPU-bound processes on two cores, it built an index over 8,000 entries in 29.8 s, 1.5 s idle (docs/reliability.md).
EMBEDDED_TIMEOUT_MS = 30_000


def default_timeout_ms(embedded: bool) -> int:
    """The bound on every wait when ``$ZOMBIE_MONGO_TIMEOUT_MS`` is unset: longer on the embedded default."""
    return EMBEDDED_TIMEOUT_MS if embedded else DEFAULT_TIMEOUT_MS


_clients: dict[tuple[str, int, bool], MongoClient[dict[str, Any]]] = {}
_clients_lock = threading.Lock()


def timeouts(timeout_ms: int) -> dict[str, int]:
    """pymongo's options that bound every wait on a server by ``timeout_ms``.

    ``timeoutMS`` bounds each operation as a whole (its server selection, its
    connection, its retry); the other three bound what runs outside an
    operation's deadline (the pool's connections, the monitor's checks).
    """
    return {
        "timeoutMS": timeout_ms,
        "serverSelectionTimeoutMS": timeout_ms,
        "connectTimeoutMS": timeout_ms,
        "socketTimeoutMS": timeout_ms,
    }


def client_for(
    url: str, timeout_ms: int = DEFAULT_TIMEOUT_MS, retry_writes: bool = True
) -> MongoClient[dict[str, Any]]:
    """The process-wide client for ``url``, every wait bounded by ``timeout_ms``: pymongo pools connections, so reuse it.

    ``retry_writes=False`` for a server that applies a retried write twice (the embedded SecantusDB, when the
    connection resets while it executes the write): a reset then fails the run, and the next run completes it.
    """
    key = (url, timeout_ms, retry_writes)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            options: dict[str, Any] = timeouts(timeout_ms)
            if not retry_writes:
                options["retryWrites"] = False
            client = MongoClient(url, tz_aware=True, tzinfo=dt.UTC, connect=False, **options)
            _clients[key] = client
        return client


#: How long closing a client may wait to tell its server the sessions it used are over: the server forgets them
#: by itself after 30 minutes, so a server gone must not hold a command's exit for the whole operation timeout.
CLOSE_TIMEOUT_SECONDS = 1.0


def close_clients(url: str | None = None) -> None:
    """Close the cached clients, or only those of ``url`` (the CLI on exit, tests before they stop a server)."""
    with _clients_lock:
        for key in [key for key in _clients if url is None or key[0] == url]:
            with pymongo.timeout(CLOSE_TIMEOUT_SECONDS):
                _clients.pop(key).close()


class DatabaseUnavailable(RuntimeError):
    """The database could not be reached; the message carries no credentials, ``facts`` say where and how long.

    ``transient``: whether waiting may change the answer (a server down may come back; a refused password does not).
    """

    def __init__(self, message: str, facts: dict[str, str | int] | None = None, transient: bool = True) -> None:
        super().__init__(message)
        self.facts = facts or {}
        self.transient = transient


def check_reachable(database: Database[Any], url: str | None, variable: str | None = None) -> None:
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
            transient=False,
        ) from None
    except pymongo.errors.PyMongoError as error:
        raise DatabaseUnavailable(
            f"cannot reach MongoDB at {where} within {timeout_ms / 1000:g} s: {_first_words(error, url)}. Is the server "
            f"up, and the URL right? (${MONGO_TIMEOUT_ENV} waits longer)",
            facts,
        ) from None


#: What follows a cleanup step's database error: the audit trail is the cleanup's log.
NEXT_RUN_COMPLETES = "the next run completes what this one left"


def database_error(
    error: pymongo.errors.PyMongoError,
    doing: str,
    urls: Sequence[str | None],
    timeout_ms: int | Mapping[str | None, int],
    then: str = NEXT_RUN_COMPLETES,
) -> DatabaseUnavailable:
    """One line for a database error met in the middle of a step: where, doing what, and which setting bounds the wait.

    ``urls``: the URLs the step works with (None: the embedded default); the one
    the error names is shown if it names one of them, else all of them, masked.
    ``timeout_ms``: the bound on every wait, or each URL's own. A lost connection,
    a stall past the timeout, a command the server refused: each is said in its
    own words, never as pymongo's traceback. ``then`` says what the databases
    hold after it and how to go on (a cleanup's next run completes what the
    failed one left; a command says its own; empty: nothing).
    """
    named = _named_by(error, urls)
    if not isinstance(timeout_ms, int):
        timeout_ms = max(timeout_ms.get(url, DEFAULT_TIMEOUT_MS) for url in named)
    cause = f"{type(error).__name__.lstrip('_')}: {_first_words(error, *urls)}"
    where = " and ".join(redact_url(url) for url in named)
    bound = f"${MONGO_TIMEOUT_ENV} bounds every wait on the database ({timeout_ms} ms)"
    if isinstance(error, pymongo.errors.OperationFailure) and not error.timeout:
        what = f"MongoDB at {where} refused a command ({cause})"
    elif error.timeout:
        what = f"MongoDB at {where} did not answer within {timeout_ms / 1000:g} s ({cause})"
    elif isinstance(error, pymongo.errors.ConnectionFailure):
        what = f"lost the connection to MongoDB at {where} ({cause})"
    else:
        what = f"MongoDB at {where} failed ({cause})"
    facts: dict[str, str | int] = {
        "url": ", ".join(redact_url(url) for url in named),
        "doing": doing,
        "error": type(error).__name__,
        "variable": MONGO_TIMEOUT_ENV,
        "timeout_ms": timeout_ms,
    }
    return DatabaseUnavailable(f"{doing}: {what}; {bound}" + (f"; {then}" if then else ""), facts)


def _named_by(error: Exception, urls: Sequence[str | None]) -> list[str | None]:
    """The URLs among ``urls`` whose hosts the error names (pymongo starts its messages with ``host:port``); else all."""
    distinct = list(dict.fromkeys(urls))
    text = str(error)
    named = [url for url in distinct if any(host in text for host in _hosts(url))]
    return named or distinct


def _hosts(url: str | None) -> list[str]:
    """The ``host:port`` seeds of a URL, read without resolving anything (a ``mongodb+srv`` one names no port)."""
    if not url:
        return []
    netloc = url.partition("://")[2].rsplit("@", 1)[-1]
    for end in "/?":
        netloc = netloc.split(end, 1)[0]
    return [host if ":" in host else f"{host}:27017" for host in netloc.split(",") if host]


def _first_words(error: Exception, *urls: str | None) -> str:
    """The cause of a pymongo error on one line, without its topology dump, credentials masked."""
    text = str(error)
    for cut in (" (configured timeouts", ", Timeout:", ", full error:"):
        text = text.split(cut, 1)[0]
    return scrub(" ".join(text.split()).rstrip("."), urls)
