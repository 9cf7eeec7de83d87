"""Where the queue and the cache are, and how long any wait on each may last: plain Python, no Dagster.

The code location's ``databases`` resource is one of these, configured; the commands that only read
(``zombie-pipeline status``, ``policy check``) build one from the environment without loading Dagster, and answer in
a second. Each URL has its own bound on every wait: a real MongoDB's default (5 s), or the embedded server's (30 s,
it shares the machine with whatever runs there), so a queue given by URL beside an embedded cache is never waited
on for the embedded server's 30 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pymongo.database import Database
from pymongo.errors import ConfigurationError

from zombie_pipeline import config
from zombie_pipeline.config import SettingError
from zombie_pipeline.queue import embedded
from zombie_pipeline.queue.audit_documents import (
    DEFAULT_EVENTS_COLLECTION,
    DEFAULT_FAILURES_COLLECTION,
    DEFAULT_SUGGESTIONS_COLLECTION,
)
from zombie_pipeline.queue.cache import DEFAULT_CACHE_COLLECTION, DEFAULT_CACHE_DATABASE
from zombie_pipeline.queue.connections import check_reachable, client_for, default_timeout_ms
from zombie_pipeline.queue.jobs import DEFAULT_JOBS_COLLECTION, DEFAULT_QUEUE_DATABASE
from zombie_pipeline.queue.secrets import redact_url, scrub
from zombie_pipeline.queue.store import Store


@dataclass(frozen=True)
class DatabaseTargets:
    """The queue database (jobs, and our own collections beside them) and the cache database, on one MongoDB or two;
    a URL of None is the embedded default."""

    #: Where the deployment's definitions read the URLs, named in the messages of a database out of reach.
    QUEUE_URL_VARIABLE: ClassVar[str] = config.QUEUE_URL_ENV
    CACHE_URL_VARIABLE: ClassVar[str] = config.CACHE_URL_ENV

    queue_url: str | None = None
    cache_url: str | None = None
    queue_database: str = DEFAULT_QUEUE_DATABASE
    cache_database: str = DEFAULT_CACHE_DATABASE
    jobs_collection: str = DEFAULT_JOBS_COLLECTION
    cache_collection: str = DEFAULT_CACHE_COLLECTION
    events_collection: str = DEFAULT_EVENTS_COLLECTION
    failures_collection: str = DEFAULT_FAILURES_COLLECTION
    suggestions_collection: str = DEFAULT_SUGGESTIONS_COLLECTION
    timeout_ms: int | None = None  # every wait on both; None: $ZOMBIE_MONGO_TIMEOUT_MS, else each URL's default

    @classmethod
    def from_env(cls) -> DatabaseTargets:
        return cls(
            queue_url=config.queue_url(),
            cache_url=config.cache_url(),
            queue_database=config.queue_database(),
            cache_database=config.cache_database(),
        )

    def urls(self) -> list[str | None]:
        """The URLs (None: the embedded default), queue first: what messages mask."""
        return [self.queue_url, self.cache_url]

    def timeout_of(self, url: str | None) -> int:
        """The bound on every wait on ``url``: the configured one, else ``$ZOMBIE_MONGO_TIMEOUT_MS``, else the default
        for a real MongoDB or for the embedded server (None)."""
        if self.timeout_ms is None:
            return config.mongo_timeout_ms(default_timeout_ms(embedded=url is None))
        if self.timeout_ms <= 0:
            raise SettingError(
                f"timeout_ms={self.timeout_ms} (the databases resource's config) must be a positive number of milliseconds"
            )
        return self.timeout_ms

    def timeouts(self) -> dict[str | None, int]:
        """Each URL's bound, for a message naming the one a database error came from."""
        return {url: self.timeout_of(url) for url in self.urls()}

    def wait_ms(self) -> int:
        """The longest wait a step may meet on either database."""
        return max(self.timeouts().values())

    def queue(self) -> Database[Any]:
        return self._database(self.queue_url, self.queue_database, self.QUEUE_URL_VARIABLE)

    def cache(self) -> Database[Any]:
        return self._database(self.cache_url, self.cache_database, self.CACHE_URL_VARIABLE)

    def store(self) -> Store:
        """The collections of both databases, unchecked."""
        return Store.of(
            self.queue(),
            self.cache(),
            jobs_collection=self.jobs_collection,
            cache_collection=self.cache_collection,
            events_collection=self.events_collection,
            failures_collection=self.failures_collection,
            suggestions_collection=self.suggestions_collection,
        )

    def check_reachable(self, cache: bool = True) -> None:
        """``DatabaseUnavailable``, one line naming the variable and the masked URL, for a database out of reach
        (the queue's; the cache's too unless ``cache=False``)."""
        check_reachable(self.queue(), self.queue_url, self.QUEUE_URL_VARIABLE)
        if cache:
            check_reachable(self.cache(), self.cache_url, self.CACHE_URL_VARIABLE)

    def describe(self) -> dict[str, str]:
        """Where each database is, without credentials."""
        return {
            "queue": f"{redact_url(self.queue_url)} database={self.queue_database}",
            "cache": f"{redact_url(self.cache_url)} database={self.cache_database}",
        }

    def _database(self, url: str | None, name: str, variable: str) -> Database[Any]:
        """The database; :class:`SettingError` naming the variable when its URL is not one pymongo accepts."""
        timeout_ms = self.timeout_of(url)
        target = url or embedded.ensure_server().url
        # The embedded server applies a retried write twice when a connection resets as it executes it: no retries
        # there (a reset fails the step, and its retry or the next run completes it); a real MongoDB applies it once.
        try:
            return client_for(target, timeout_ms, retry_writes=url is not None)[name]
        except ConfigurationError as error:  # the value itself is not shown: a malformed URL may still hold a password
            raise SettingError(
                f"{variable} is not a MongoDB URL: {scrub(str(error), [target])} (expected "
                "mongodb://[user:password@]host[:port][/?options] or mongodb+srv://...)"
            ) from None


def timeouts_from_env() -> Mapping[str | None, int]:
    """Each configured URL's bound on every wait (a malformed ``$ZOMBIE_MONGO_TIMEOUT_MS``: the defaults)."""
    try:
        return DatabaseTargets.from_env().timeouts()
    except SettingError:
        return {url: default_timeout_ms(embedded=url is None) for url in config.configured_urls()}
