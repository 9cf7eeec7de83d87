"""MongoDB connections: one client per URL per process, credentials kept out of sight.

Every masking of a secret lives here: :func:`redact_url` for a URL shown on
purpose, :func:`redact` and :func:`scrub` for any text that may quote one.

Also the indexes the pipeline's own queries need. Each index is named with our
prefix, so :func:`ensure_indexes` can tell ours from the deployment's and never
touches an index it did not create.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, TypeVar
from urllib.parse import unquote, unquote_plus, urlsplit

import pymongo
from bson.codec_options import CodecOptions
from pymongo import MongoClient
from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.database import Database

from zombie_pipeline.config import SERVER_SELECTION_TIMEOUT_ENV
from zombie_pipeline.documents import Cache, Event, Job, ScheduledRetry

INDEX_PREFIX = "zombie_pipeline_"
T = TypeVar("T")
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
                tzinfo=dt.timezone.utc,
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
    return CodecOptions(tz_aware=True, tzinfo=dt.timezone.utc)


# --- secrets -----------------------------------------------------------------


def url_secrets(url: str | None) -> list[str]:
    """The credential strings of a URL, raw and percent-decoded, longest first."""
    if not url:
        return []
    _, separator, rest = url.partition("://")
    if not separator or "@" not in rest:
        return []
    # up to the last '@': an unescaped '/', '?' or '#' in a password ends urlsplit's netloc early
    userinfos = {rest.rsplit("@", 1)[0]}
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        netloc = ""
    if "@" in netloc:
        userinfos.add(netloc.rsplit("@", 1)[0])
    secrets = set()
    for userinfo in userinfos:
        for value in (userinfo, userinfo.partition(":")[2]):
            secrets |= {value, unquote(value), unquote_plus(value)}  # pymongo decodes with unquote_plus
    return sorted((s for s in secrets if s), key=len, reverse=True)


def redact_url(url: str | None) -> str:
    """The URL with its user and password replaced, safe for logs and metadata."""
    if not url:
        return "(embedded default)"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable URL)"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***:***@" + netloc.rsplit("@", 1)[1]
    elif "@" in url.partition("://")[2]:  # an unescaped '/', '?' or '#' in the password
        return redact_url(f"{parts.scheme}://***:***@{url.rsplit('@', 1)[1]}")
    return f"{parts.scheme}://{netloc}{parts.path}"


def redact(text: str, urls: Iterable[str | None]) -> str:
    """``text`` with every credential of ``urls`` masked."""
    for url in urls:
        for secret in url_secrets(url):
            text = text.replace(secret, "***")
    return text


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")


def scrub(text: str, urls: Iterable[str | None] = ()) -> str:
    """``text`` without the credentials of ``urls``, nor any ``user:password@`` of any URL in it."""
    return _USERINFO.sub(r"\g<scheme>***@", redact(text, urls))


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


# --- query shapes ------------------------------------------------------------------


def on_index(index_part: Mapping[str, Any], rest: Mapping[str, Any], *stages: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An aggregation matching ``index_part`` first, then ``rest``.

    MongoDB merges the two ``$match`` stages and plans them as one query; a server
    whose planner scans the whole collection for an ``$or`` or an ``$in`` (the
    embedded SecantusDB does, and a hint makes it slower still) keeps to the index
    for the first stage. Either way the cost follows the documents the index range
    holds, never the whole collection.
    """
    pipeline = [{"$match": dict(index_part)}]
    if rest:
        pipeline.append({"$match": dict(rest)})
    return pipeline + [dict(stage) for stage in stages]


# --- transactions ---------------------------------------------------------------

_transactions: dict[int, bool] = {}


def supports_transactions(client: MongoClient) -> bool:
    """Whether the server runs transactions: a replica set or a sharded cluster does, a standalone does not."""
    key = id(client)
    if key not in _transactions:
        hello = client.admin.command("hello")
        _transactions[key] = bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"
    return _transactions[key]


class Conflict(Exception):
    """Raised by a transaction's work when a concurrent writer got there first: the work is done again."""


def atomically(client: MongoClient, work: Callable[[ClientSession | None], T], enabled: bool = True, attempts: int = 5) -> T:
    """``work(session)`` in one transaction where asked and the server has them, else ``work(None)``.

    A write conflict with a worker (or a :class:`Conflict` the work raises) starts the transaction
    again, a few times: ``work`` computes everything from what it reads. Anything else, a lost
    connection above all, is raised at once: the work is recognized as done or not by the next run,
    and a dead server must not hold a cleanup for minutes.
    """
    if not (enabled and supports_transactions(client)):
        return work(None)
    for attempt in range(attempts):
        with client.start_session() as session:
            session.start_transaction()
            try:
                result = work(session)
                session.commit_transaction()
                return result
            except (Conflict, pymongo.errors.OperationFailure) as error:
                _abort(session)
                transient = isinstance(error, Conflict) or error.has_error_label("TransientTransactionError")
                if not transient or attempt == attempts - 1:
                    raise
            except BaseException:
                _abort(session)
                raise
    raise AssertionError("unreachable")


def _abort(session: ClientSession) -> None:
    try:
        if session.in_transaction:
            session.abort_transaction()
    except pymongo.errors.PyMongoError:
        pass  # the server aborts it after its lifetime anyway


# --- indexes -------------------------------------------------------------------


@dataclass(frozen=True)
class IndexSpec:
    """An index one of our queries needs, and which query.

    ``as_deployment``: the deployment declares the same index; it is then
    created exactly as the deployment's own models would (default name, same
    options), so that their index creation finds it identical instead of
    failing on a conflict of names.
    """

    name: str
    keys: tuple[tuple[str, int], ...]
    used_by: str
    unique: bool = False
    as_deployment: bool = False
    #: The name the deployment gives the index where it names it (else the server's default name).
    deployment_name: str | None = None

    @property
    def full_name(self) -> str:
        if self.as_deployment:
            return self.deployment_name or "_".join(f"{key}_{direction}" for key, direction in self.keys)
        return INDEX_PREFIX + self.name

    def create(self, collection: Collection) -> str:
        """Create the index under :attr:`full_name`; its name.

        One the deployment declares is created with the options its models send (mongoengine adds
        ``background: false`` to every index), so that its startup finds the index identical: a server
        that compares options would otherwise refuse the deployment's own creation (``IndexKeySpecsConflict``).
        """
        options: dict[str, bool] = {"background": False} if self.as_deployment else {}
        if self.unique:  # in the deployment's order: some servers compare the options as written
            options["unique"] = True
        return collection.create_index(list(self.keys), name=self.full_name, **options)


JOB_INDEXES = (
    IndexSpec(
        "status_started_at",
        ((Job.STATUS, pymongo.ASCENDING), (Job.STARTED_AT, pymongo.ASCENDING)),
        "detection: started jobs older than the heartbeat timeout, and the stale-jobs sensor count",
    ),
    IndexSpec(
        "status_finished_at",
        ((Job.STATUS, pymongo.ASCENDING), (Job.FINISHED_AT, pymongo.ASCENDING)),
        "duration statistics: finished jobs of one day",
    ),
    IndexSpec(
        "unicity_id_status",
        ((Job.UNICITY_ID, pymongo.ASCENDING), (Job.STATUS, pymongo.ASCENDING)),
        "retries: is a waiting or started job already there for this unicity id",
    ),
)

#: The deployment declares both on its cache (every generation): created only where missing, which a
#: deployment's cache never is (a simulated or empty one may be).
CACHE_INDEXES = (
    IndexSpec(
        "key",
        tuple((field, pymongo.ASCENDING) for field in (Cache.KIND, Cache.DATASET, Cache.CONFIG, Cache.SPLIT)),
        "cache errors: an error entry is unique per key, as in the deployment",
        unique=True,
        as_deployment=True,
    ),
    IndexSpec(
        "dataset_kind",
        ((Cache.DATASET, pymongo.ASCENDING), (Cache.KIND, pymongo.ASCENDING), (Cache.HTTP_STATUS, pymongo.ASCENDING)),
        "cache errors and the cache check: a batch's entries in one read, by dataset then kind",
        as_deployment=True,
    ),
)
#: The deployment declares it from 2026 (``{"fields": ["kind", "updated_at", "dataset"], "name": "kind_updated"}``);
#: created by the statistics only when an operator asks (a production cache holds tens of millions of entries).
CACHE_UPDATED_INDEX = IndexSpec(
    "kind_updated",
    ((Cache.KIND, pymongo.ASCENDING), (Cache.UPDATED_AT, pymongo.ASCENDING), (Cache.DATASET, pymongo.ASCENDING)),
    "duration statistics where finished jobs are deleted: one day of one kind's cache entries",
    as_deployment=True,
    deployment_name="kind_updated",
)
EVENT_INDEXES = (
    IndexSpec(
        "state_lease",
        ((Event.STATE, pymongo.ASCENDING), (Event.LEASE_UNTIL, pymongo.ASCENDING)),
        "reconcile: unfinished events whose lease has expired",
    ),
    IndexSpec(
        "unicity_id",
        ((f"{Event.JOB}.{Job.UNICITY_ID}", pymongo.ASCENDING), (Event.FINALIZED_AT, pymongo.DESCENDING)),
        "statistics and retries: zombie history of one job",
    ),
    IndexSpec(
        "finalized_at",
        ((Event.FINALIZED_AT, pymongo.ASCENDING),),
        "statistics and repeat offenders: zombies of one day",
    ),
    IndexSpec(
        "compensation_state",
        ((Event.COMPENSATION_STATE, pymongo.ASCENDING),),
        "compensations: the ones still to run or to try again",
    ),
)


RETRY_INDEXES = (
    IndexSpec(
        "state_due_at",
        ((ScheduledRetry.STATE, pymongo.ASCENDING), (ScheduledRetry.DUE_AT, pymongo.ASCENDING)),
        "delayed retries: the pending ones that are due",
    ),
)


def ensure_indexes(collection: Collection, specs: Iterable[IndexSpec]) -> list[str]:
    """Create the missing indexes among ``specs``; return the names created.

    An index with the same keys already there (ours or the deployment's) is
    reused as it is; nothing is ever dropped or modified.
    """
    existing = collection.index_information()
    existing_keys = {tuple(info["key"]) for info in existing.values()}
    created = []
    for spec in specs:
        if spec.full_name in existing or _normalized(spec.keys) in {_normalized(k) for k in existing_keys}:
            continue
        try:
            spec.create(collection)
        except pymongo.errors.DuplicateKeyError:  # existing duplicates: the lookup still needs the index
            collection.create_index(list(spec.keys), name=spec.full_name)
        created.append(spec.full_name)
    return created


def _normalized(keys) -> tuple:
    return tuple((field, str(int(direction)) if isinstance(direction, (int, float)) else str(direction)) for field, direction in keys)
