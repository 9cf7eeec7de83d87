"""Dagster resources: where the queue and the cache are, and the cleanup policy.

The URLs are read from environment variables when a resource is used, never
stored in config: Dagster shows resource config in its UI, and a URL may carry
a password. With no URL set, the embedded server is started (or reused).
"""

from __future__ import annotations

import os
from typing import Optional

import dagster as dg
from pydantic import Field
from pymongo.database import Database

from zombie_pipeline import embedded
from zombie_pipeline.documents import (
    DEFAULT_CACHE_COLLECTION,
    DEFAULT_CACHE_DATABASE,
    DEFAULT_EVENTS_COLLECTION,
    DEFAULT_FAILURES_COLLECTION,
    DEFAULT_JOBS_COLLECTION,
    DEFAULT_QUEUE_DATABASE,
    DEFAULT_ZOMBIE_HTTP_STATUS,
)
from zombie_pipeline.mongo import (
    CACHE_URL_ENV,
    DEFAULT_SERVER_SELECTION_TIMEOUT_MS,
    QUEUE_URL_ENV,
    client_for,
    redact_url,
)
from zombie_pipeline.policy import PolicyError, ZombiePolicy
from zombie_pipeline.store import Store

QUEUE_DATABASE_ENV = "QUEUE_MONGO_DATABASE"
CACHE_DATABASE_ENV = "CACHE_MONGO_DATABASE"


class _MongoDatabaseResource(dg.ConfigurableResource):
    url_env_var: str = Field(description="Name of the environment variable holding the MongoDB URL.")
    database: str = Field(description="Database name.")
    server_selection_timeout_ms: int = Field(
        default=DEFAULT_SERVER_SELECTION_TIMEOUT_MS,
        description="How long to wait for the server before a run fails.",
        gt=0,
    )

    def url(self) -> Optional[str]:
        """The configured URL, or None for the embedded default."""
        return os.environ.get(self.url_env_var) or None

    def connection_url(self) -> str:
        """The URL to connect to: the configured one, else the embedded server's (started if needed)."""
        return self.url() or embedded.ensure_server().url

    def get_database(self) -> Database:
        return client_for(self.connection_url(), self.server_selection_timeout_ms)[self.database]

    def describe(self) -> str:
        """Where this resource points, without credentials."""
        return f"{redact_url(self.url())} database={self.database}"


class QueueDatabase(_MongoDatabaseResource):
    """The queue database: jobs, and our own audit and failure collections."""

    url_env_var: str = QUEUE_URL_ENV
    database: str = DEFAULT_QUEUE_DATABASE
    jobs_collection: str = DEFAULT_JOBS_COLLECTION
    events_collection: str = DEFAULT_EVENTS_COLLECTION
    failures_collection: str = DEFAULT_FAILURES_COLLECTION


class CacheDatabase(_MongoDatabaseResource):
    """The cache database, where users read each step's response."""

    url_env_var: str = CACHE_URL_ENV
    database: str = DEFAULT_CACHE_DATABASE
    cache_collection: str = DEFAULT_CACHE_COLLECTION


def store_of(queue_db: QueueDatabase, cache_db: CacheDatabase) -> Store:
    return Store.of(
        queue_db.get_database(),
        cache_db.get_database(),
        jobs_collection=queue_db.jobs_collection,
        cache_collection=cache_db.cache_collection,
        events_collection=queue_db.events_collection,
        failures_collection=queue_db.failures_collection,
    )


class ZombiePolicyResource(dg.ConfigurableResource):
    """Thresholds and limits shared by the cleanup job, the sensors and the checks."""

    heartbeat_timeout_seconds: int = Field(default=300, description="A job is dead after this long without a heartbeat.")
    max_duration_seconds: int = Field(default=1200, description="Default maximum duration (T2) of a job.")
    max_duration_seconds_by_type: dict[str, int] = Field(
        default_factory=dict, description="T2 per job type, overriding max_duration_seconds."
    )
    max_stale_fraction: float = Field(
        default=0.5, description="Brake: refuse to act when more than this share of started jobs look dead."
    )
    min_started_for_brake: int = Field(default=20, description="The brake applies from this many started jobs on.")
    crashed_retry_limit: int = Field(default=3, description="Automatic retries after JobManagerCrashedError.")
    exceeded_retry_limit: int = Field(
        default=0, description="Automatic retries after JobManagerExceededMaximumDurationError."
    )
    http_status: int = Field(default=DEFAULT_ZOMBIE_HTTP_STATUS, description="http_status of the cache error entry.")
    batch_size: int = Field(default=500, description="Documents per bulk write.")
    claim_lease_seconds: int = Field(
        default=300, description="After this long, an unfinished finalization of a crashed run is taken over."
    )
    cache_generation: Optional[str] = Field(
        default=None, description="Cache document generation to write (e.g. '2023-01'); unset: detected."
    )
    use_suggested_max_durations: bool = Field(
        default=False, description="Take per-type T2 from the latest statistics suggestions (opt-in)."
    )

    def policy(self, max_duration_seconds_by_type: Optional[dict[str, int]] = None) -> ZombiePolicy:
        """The validated core policy; raises PolicyError naming each bad field."""
        values = self.model_dump() if hasattr(self, "model_dump") else dict(self)
        values.pop("use_suggested_max_durations", None)
        if max_duration_seconds_by_type is not None:
            values["max_duration_seconds_by_type"] = max_duration_seconds_by_type
        return ZombiePolicy(**{name: values[name] for name in ZombiePolicy.__dataclass_fields__})

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Refuse a bad policy when the run starts, before any op reads or writes.
        try:
            self.policy()
        except PolicyError as error:
            raise dg.Failure(str(error)) from None


def resources_from_env() -> dict[str, dg.ConfigurableResource]:
    """The resources of the deployment, database names from the environment (URLs stay there)."""
    return {
        "queue_db": QueueDatabase(database=os.environ.get(QUEUE_DATABASE_ENV, DEFAULT_QUEUE_DATABASE)),
        "cache_db": CacheDatabase(database=os.environ.get(CACHE_DATABASE_ENV, DEFAULT_CACHE_DATABASE)),
        "zombie_policy": ZombiePolicyResource(),
    }
