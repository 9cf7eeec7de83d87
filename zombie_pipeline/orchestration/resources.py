"""Dagster resources: where the queue and the cache are, the cleanup policy, and the failure webhook (the
metrics gateway is in ``orchestration/metrics.py``; its URL carries no credentials and is its config).

URLs are read from environment variables when a resource is used, never stored
in config: Dagster shows resource config in its UI, and a URL may carry a
password. With no URL set, the embedded server is started (or reused).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import dagster as dg
import pymongo
from pydantic import BaseModel, ConfigDict, Field, create_model
from pymongo.database import Database
from pymongo.errors import ConfigurationError

from zombie_pipeline import config
from zombie_pipeline.config import SettingError
from zombie_pipeline.orchestration.metrics import MetricsGateway, metrics_gateway_from_env
from zombie_pipeline.policy import InvalidPolicy, ZombiePolicy, policy_fields, validated
from zombie_pipeline.queue.connections import (
    DEFAULT_TIMEOUT_MS,
    EMBEDDED_TIMEOUT_MS,
    DatabaseUnavailable,
    check_reachable,
    client_for,
    database_error,
    default_timeout_ms,
)
from zombie_pipeline.queue.documents import (
    DEFAULT_CACHE_COLLECTION,
    DEFAULT_CACHE_DATABASE,
    DEFAULT_EVENTS_COLLECTION,
    DEFAULT_FAILURES_COLLECTION,
    DEFAULT_JOBS_COLLECTION,
    DEFAULT_QUEUE_DATABASE,
    DEFAULT_SUGGESTIONS_COLLECTION,
)
from zombie_pipeline.queue.secrets import redact_url, scrub
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation import embedded
from zombie_pipeline.statistics.suggestion_log import effective_policy


class _MongoDatabaseResource(dg.ConfigurableResource):
    url_env_var: str = Field(description="Name of the environment variable holding the MongoDB URL.")
    database: str = Field(description="Database name.")
    # The name is the one it had when it bounded only the choice of a server; run configs name it so. Checked by
    # get_database, in the step (a bound here would fail the run at resource setup, which Dagster retries).
    server_selection_timeout_ms: int | None = Field(
        default=None,
        description="How long any wait on the database may last before a run fails, in milliseconds, more than 0: "
        "connecting, choosing a server, each reply, each operation with its retry (unset: "
        f"${config.MONGO_TIMEOUT_ENV}, else {DEFAULT_TIMEOUT_MS}, or {EMBEDDED_TIMEOUT_MS} on the embedded default).",
    )

    def url(self) -> str | None:
        """The configured URL, or None for the embedded default."""
        return config.setting(self.url_env_var)

    def connection_url(self) -> str:
        """The URL to connect to: the configured one, else the embedded server's (started if needed)."""
        return self.url() or embedded.ensure_server().url

    def timeout_ms(self) -> int:
        """The bound on every wait: this config's, else ``$ZOMBIE_MONGO_TIMEOUT_MS``, else the default for the target."""
        if self.server_selection_timeout_ms is None:
            return config.mongo_timeout_ms(default_timeout_ms(embedded=self.url() is None))
        if self.server_selection_timeout_ms <= 0:
            raise SettingError(
                f"server_selection_timeout_ms={self.server_selection_timeout_ms} (the {self.database} database's "
                "resource config) must be a positive number of milliseconds"
            )
        return self.server_selection_timeout_ms

    def get_database(self) -> Database:
        """The database; :class:`SettingError` naming the variable when its URL is not one pymongo accepts."""
        timeout_ms = self.timeout_ms()
        url = self.connection_url()
        # The embedded server applies a retried write twice when a connection resets as it executes it: no retries
        # there (a reset fails the run, the next run completes it); a real MongoDB applies a retried write once.
        embedded_default = self.url() is None
        try:
            return client_for(url, timeout_ms, retry_writes=not embedded_default)[self.database]
        except ConfigurationError as error:  # the value itself is not shown: a malformed URL may still hold a password
            raise SettingError(
                f"{self.url_env_var} is not a MongoDB URL: {scrub(str(error), [url])} (expected "
                "mongodb://[user:password@]host[:port][/?options] or mongodb+srv://...)"
            ) from None

    def describe(self) -> str:
        """Where this resource points, without credentials."""
        return f"{redact_url(self.url())} database={self.database}"


class QueueDatabase(_MongoDatabaseResource):
    """The queue database: jobs, and our own audit, failure and suggestion collections."""

    url_env_var: str = config.QUEUE_URL_ENV
    database: str = DEFAULT_QUEUE_DATABASE
    jobs_collection: str = DEFAULT_JOBS_COLLECTION
    events_collection: str = DEFAULT_EVENTS_COLLECTION
    failures_collection: str = DEFAULT_FAILURES_COLLECTION
    suggestions_collection: str = DEFAULT_SUGGESTIONS_COLLECTION


class CacheDatabase(_MongoDatabaseResource):
    """The cache database, where users read each step's response."""

    url_env_var: str = config.CACHE_URL_ENV
    database: str = DEFAULT_CACHE_DATABASE
    cache_collection: str = DEFAULT_CACHE_COLLECTION


def check_databases(*resources: _MongoDatabaseResource) -> None:
    """Raise :class:`DatabaseUnavailable`, one line naming the variable and the masked URL, if a database cannot be reached."""
    for resource in resources:
        check_reachable(resource.get_database(), resource.url(), resource.url_env_var)


def unavailable_failure(error: DatabaseUnavailable) -> dg.Failure:
    """A run's failure for a database it cannot reach: the one line, and where it looked and how long, as metadata;
    retried by the step's policy only if waiting may help (a refused password is not)."""
    return dg.Failure(description=str(error), metadata=dict(error.facts), allow_retries=error.transient)


F = TypeVar("F", bound=Callable[..., Any])


def failing_in_one_line(doing: str) -> Callable[[F], F]:
    """An op's or an asset's body whose database errors fail it in one line: the masked URL, ``doing``, the setting.

    Whatever pymongo raises in the middle of the step (a connection reset, a
    stall past ``$ZOMBIE_MONGO_TIMEOUT_MS``, a command refused) becomes a
    :class:`dagster.Failure` whose description is that line and whose metadata
    says where, doing what and how long it waited; the URLs are the database
    resources the step was given. On the step's last attempt the failure is not
    handed to its retry policy, which has none left to give: Dagster would report
    it as "Exceeded max_retries", the cause a level below; it reports it as it is.
    """

    def decorate(body: F) -> F:
        @functools.wraps(body)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return body(*args, **kwargs)
            except pymongo.errors.PyMongoError as error:
                databases = [value for value in kwargs.values() if isinstance(value, _MongoDatabaseResource)]
                urls = [database.url() for database in databases] or [None]
                timeout_ms = max((database.timeout_ms() for database in databases), default=DEFAULT_TIMEOUT_MS)
                failure = unavailable_failure(database_error(error, doing, urls, timeout_ms))
            except dg.Failure as refused:
                failure = refused
            if failure.allow_retries and _last_attempt(args[0] if args else kwargs.get("context")):
                failure = dg.Failure(failure.description, failure.metadata, allow_retries=False)
            raise failure from None

        return run  # type: ignore[return-value]

    return decorate


def _last_attempt(context: Any) -> bool:
    """Whether a step's retry policy has no retry left for it (True for a step without one)."""
    if not isinstance(context, dg.OpExecutionContext | dg.AssetExecutionContext):
        return True
    policy = context.op_def.retry_policy
    return policy is None or context.retry_number >= policy.max_retries


def store_of(queue_db: QueueDatabase, cache_db: CacheDatabase, check: bool = False) -> Store:
    """The collections of both databases; with ``check`` (in a step), a database out of reach fails the step in
    one line (a ``dg.Failure`` its retry policy may retry), and a malformed URL too (never retried)."""
    try:
        store = Store.of(
            queue_db.get_database(),
            cache_db.get_database(),
            jobs_collection=queue_db.jobs_collection,
            cache_collection=cache_db.cache_collection,
            events_collection=queue_db.events_collection,
            failures_collection=queue_db.failures_collection,
            suggestions_collection=queue_db.suggestions_collection,
        )
        if check:
            check_databases(queue_db, cache_db)
    except SettingError as error:
        if not check:
            raise
        raise dg.Failure(description=str(error), allow_retries=False) from None
    except DatabaseUnavailable as error:
        raise unavailable_failure(error) from None
    return store


def settings_of(model: type[BaseModel]) -> type[BaseModel]:
    """``model``'s fields as Dagster config: the same names, types, defaults and descriptions, without the bounds.

    Dagster checks a config's types before a run is launched (the Launchpad marks them) but not pydantic's bounds
    nor the rules across fields: built with them, a resource refuses a bad value while Dagster initializes the run's
    resources, a failure of the run itself that run retries repeat and that reaches the failure sensor as Dagster's
    generic "an exception was thrown". Without them, the first step builds the model and refuses it in one line.
    """
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        default = {"default_factory": info.default_factory} if info.default_factory else {"default": info.default}
        fields[name] = (info.annotation, Field(description=info.description, **default))
    return create_model(f"{model.__name__}Settings", __config__=ConfigDict(extra="forbid"), **fields)


if TYPE_CHECKING:  # the same fields, as a type checker reads them
    PolicySettings = ZombiePolicy
else:
    PolicySettings = settings_of(ZombiePolicy)


class PolicyRefused(dg.Failure, InvalidPolicy):
    """A run's failure for a policy that is refused: one line naming each field and value, never retried."""

    def __init__(self, error: InvalidPolicy) -> None:
        super().__init__(description=str(error), allow_retries=False)


class ZombiePolicyResource(dg.ConfigurableResource, PolicySettings):
    """Thresholds and limits shared by the cleanup job, the sensors and the checks (fields: ``policy.ZombiePolicy``).

    Dagster checks the types before launch; :meth:`policy` checks the values (bounds, rules across fields), first
    thing in each step that uses it, before anything is read or written: a bad value fails that step with
    :class:`PolicyRefused`, a one-line ``dg.Failure`` that no retry repeats.
    """

    def policy(self) -> ZombiePolicy:
        """The configured policy, as the core takes it; :class:`PolicyRefused` when a value is refused."""
        try:
            return validated(policy_fields(self.model_dump()))
        except InvalidPolicy as error:
            raise PolicyRefused(error) from None

    def in_force(self, store: Store) -> ZombiePolicy:
        """The policy a cleanup applies now: suggested maximum durations included when opted in."""
        return effective_policy(self.policy(), store.suggestions)


class FailureWebhook(dg.ConfigurableResource):
    """Where run failures are POSTed as JSON. The URL stays in the environment: it often carries a token."""

    url_env_var: str = Field(
        default=config.WEBHOOK_URL_ENV, description="Environment variable holding the webhook URL; unset: no POST."
    )
    timeout_seconds: float = Field(default=5.0, gt=0, le=30, description="A slow webhook must not hold the sensor.")

    def url(self) -> str | None:
        return config.setting(self.url_env_var)


class DeploymentResources(TypedDict):
    """The resources every job and asset of the code location is given, by the names they ask for."""

    queue_db: QueueDatabase
    cache_db: CacheDatabase
    zombie_policy: ZombiePolicyResource
    failure_webhook: FailureWebhook
    metrics_gateway: MetricsGateway


def resources_from_env() -> DeploymentResources:
    """The resources of the deployment, database names from the environment (URLs stay there)."""
    config.mongo_timeout_ms(DEFAULT_TIMEOUT_MS)  # a malformed value is refused when the code location loads
    return {
        "queue_db": QueueDatabase(database=config.queue_database()),
        "cache_db": CacheDatabase(database=config.cache_database()),
        "zombie_policy": ZombiePolicyResource(),
        "failure_webhook": FailureWebhook(),
        "metrics_gateway": metrics_gateway_from_env(),
    }
