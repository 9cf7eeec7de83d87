"""Dagster resources: the deployment's databases, the cleanup policy, and the failure webhook (the metrics gateway is
in ``orchestration/pushgateway.py``; its URL carries no credentials and is its config).

A MongoDB URL may carry a password, and Dagster shows resource config in its UI: the deployment's definitions give
the URLs as ``dg.EnvVar`` (the UI shows the variable's name, never its value), or None for the embedded server.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, TypedDict

import dagster as dg
import pymongo
from pydantic import Field
from pymongo.database import Database
from pymongo.errors import ConfigurationError

from zombie_pipeline import config
from zombie_pipeline.config import SettingError
from zombie_pipeline.orchestration.pushgateway import MetricsGateway, metrics_gateway_from_env
from zombie_pipeline.policy import InvalidPolicy, PolicySettings, ZombiePolicy, policy_from_file, validated
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

StepContext = dg.OpExecutionContext | dg.AssetExecutionContext | dg.AssetCheckExecutionContext


class Databases(dg.ConfigurableResource["Databases"]):
    """The queue database (jobs, and our own collections beside them) and the cache database, on one MongoDB or two.

    :meth:`store_for` is how a step reaches them: checked first, and any database error within the step said in one
    line (the masked URL, what the step was doing, the setting that bounds every wait).
    """

    #: Where the deployment's definitions read the URLs, named in the messages of a database out of reach.
    QUEUE_URL_VARIABLE: ClassVar[str] = config.QUEUE_URL_ENV
    CACHE_URL_VARIABLE: ClassVar[str] = config.CACHE_URL_ENV

    queue_url: str | None = Field(
        default=None, description=f"MongoDB URL of the queue (${config.QUEUE_URL_ENV}); unset: the embedded server."
    )
    cache_url: str | None = Field(
        default=None, description=f"MongoDB URL of the cache (${config.CACHE_URL_ENV}); unset: the embedded server."
    )
    queue_database: str = Field(default=DEFAULT_QUEUE_DATABASE, description="The queue's database.")
    cache_database: str = Field(default=DEFAULT_CACHE_DATABASE, description="The cache's database.")
    jobs_collection: str = DEFAULT_JOBS_COLLECTION
    cache_collection: str = DEFAULT_CACHE_COLLECTION
    events_collection: str = DEFAULT_EVENTS_COLLECTION
    failures_collection: str = DEFAULT_FAILURES_COLLECTION
    suggestions_collection: str = DEFAULT_SUGGESTIONS_COLLECTION
    # Checked where a database is reached, in the step: a bound here would fail the run at resource setup.
    timeout_ms: int | None = Field(
        default=None,
        description="How long any wait on a database may last before a step fails, in milliseconds, more than 0: "
        f"connecting, choosing a server, each reply, each operation with its retry (unset: ${config.MONGO_TIMEOUT_ENV}, "
        f"else {DEFAULT_TIMEOUT_MS}, or {EMBEDDED_TIMEOUT_MS} on the embedded default).",
    )

    def urls(self) -> list[str | None]:
        """The configured URLs (None: the embedded default), queue first: what messages mask."""
        return [_value(self.queue_url), _value(self.cache_url)]

    def wait_ms(self) -> int:
        """The bound on every wait: this config's, else ``$ZOMBIE_MONGO_TIMEOUT_MS``, else the default for the target."""
        if self.timeout_ms is None:
            embedded_default = None in self.urls()
            return config.mongo_timeout_ms(default_timeout_ms(embedded=embedded_default))
        if self.timeout_ms <= 0:
            raise SettingError(
                f"timeout_ms={self.timeout_ms} (the databases resource's config) must be a positive number of milliseconds"
            )
        return self.timeout_ms

    def queue(self) -> Database[Any]:
        return self._database(self.urls()[0], self.queue_database, self.QUEUE_URL_VARIABLE)

    def cache(self) -> Database[Any]:
        return self._database(self.urls()[1], self.cache_database, self.CACHE_URL_VARIABLE)

    def store(self) -> Store:
        """The collections of both databases, unchecked (a sensor checks what it reads itself)."""
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
        """:class:`DatabaseUnavailable`, one line naming the variable and the masked URL, for a database out of reach
        (the queue's; the cache's too unless ``cache=False``)."""
        queue_url, cache_url = self.urls()
        check_reachable(self.queue(), queue_url, self.QUEUE_URL_VARIABLE)
        if cache:
            check_reachable(self.cache(), cache_url, self.CACHE_URL_VARIABLE)

    @contextlib.contextmanager
    def store_for(self, context: StepContext, doing: str) -> Iterator[Store]:
        """The store of a step, checked; every database error in the block a one-line :class:`dagster.Failure`.

        A malformed URL or timeout is refused and never retried; a database out of reach, or an error in the middle
        of the step, is retried by the step's retry policy where waiting may help. On the step's last attempt the
        failure is not handed to a retry policy that has no retry left: Dagster would report "Exceeded max_retries",
        the cause a level below; it reports the line as it is.
        """
        try:
            try:
                store = self.store()
                self.check_reachable()
                yield store
            except SettingError as error:
                raise dg.Failure(description=str(error), allow_retries=False) from None
            except DatabaseUnavailable as error:
                raise _unavailable(error) from None
            except pymongo.errors.PyMongoError as error:
                raise _unavailable(database_error(error, doing, self.urls(), self.wait_ms())) from None
        except dg.Failure as failure:
            if failure.allow_retries and _last_attempt(context):
                raise dg.Failure(failure.description, failure.metadata, allow_retries=False) from None
            raise

    def describe(self) -> dict[str, str]:
        """Where each database is, without credentials."""
        queue_url, cache_url = self.urls()
        return {
            "queue": f"{redact_url(queue_url)} database={self.queue_database}",
            "cache": f"{redact_url(cache_url)} database={self.cache_database}",
        }

    def _database(self, url: str | None, name: str, variable: str) -> Database[Any]:
        """The database; :class:`SettingError` naming the variable when its URL is not one pymongo accepts."""
        timeout_ms = self.wait_ms()
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


def _value(url: str | None) -> str | None:
    """A URL as configured: an ``EnvVar`` Dagster has not resolved (the resource used outside a run: the CLI, the
    demo) is read from the environment here."""
    return url.get_value() if isinstance(url, dg.EnvVar) else url


def _unavailable(error: DatabaseUnavailable) -> dg.Failure:
    """A step's failure for a database error: the one line, and where it looked and how long, as metadata; retried
    by the step's policy only if waiting may help (a refused password is not)."""
    return dg.Failure(description=str(error), metadata=dict(error.facts), allow_retries=error.transient)


def _last_attempt(context: StepContext) -> bool:
    """Whether a step's retry policy has no retry left for it (True for a step without one)."""
    step = context.op_execution_context
    policy = step.op_def.retry_policy
    return policy is None or step.retry_number >= policy.max_retries


class PolicyRefused(dg.Failure, InvalidPolicy):
    """A run's failure for a policy that is refused: one line naming each field and value, never retried."""

    def __init__(self, error: InvalidPolicy) -> None:
        super().__init__(description=str(error), allow_retries=False)


class ZombiePolicyResource(dg.ConfigurableResource["ZombiePolicyResource"], PolicySettings):
    """Thresholds and limits shared by the cleanup job, the sensors and the checks (``policy.PolicySettings``).

    The location's policy file is its base (:func:`policy_from_env`); the settings given here (a Launchpad run's
    ``resources: zombie_policy: config:``) override those they name: Dagster builds the resource from a run's config
    alone, so what the run does not name comes from the file, never from the code's defaults.

    Dagster checks the types before launch; :meth:`policy` checks the values (bounds, rules across fields), first
    thing in each step that uses it, before anything is read or written: a bad value fails that step with
    :class:`PolicyRefused`, a one-line ``dg.Failure`` that no retry repeats.
    """

    def policy(self, fresh: bool = False) -> ZombiePolicy:
        """The policy in force, as the core takes it; :class:`PolicyRefused` when a value is refused. ``fresh``: the
        policy file read again, not as this process first read it (a run that lasts, a sensor that decides for it)."""
        given = self.model_dump(include=self.model_fields_set & set(PolicySettings.model_fields))
        try:
            return validated({**location_settings(fresh), **given})
        except InvalidPolicy as error:
            raise PolicyRefused(error) from None

    def in_force(self, store: Store, fresh: bool = False) -> ZombiePolicy:
        """The policy a cleanup applies now: suggested maximum durations included when opted in."""
        return effective_policy(self.policy(fresh), store.suggestions)


class FailureWebhook(dg.ConfigurableResource["FailureWebhook"]):
    """Where run failures are POSTed as JSON. Its URL often carries a token: an ``EnvVar`` in the deployment."""

    url: str | None = Field(default=None, description=f"The webhook's URL (${config.WEBHOOK_URL_ENV}); unset: no POST.")
    timeout_seconds: float = Field(default=5.0, gt=0, le=30, description="A slow webhook must not hold the sensor.")


class DeploymentResources(TypedDict):
    """The resources every job and asset of the code location is given, by the names they ask for."""

    databases: Databases
    zombie_policy: ZombiePolicyResource
    failure_webhook: FailureWebhook
    metrics_gateway: MetricsGateway


def url_from_env(variable: str) -> str | None:
    """The URL in ``$variable`` as Dagster config: an ``EnvVar`` (the UI names the variable, never shows its value),
    or None for the embedded server when the variable is unset."""
    return dg.EnvVar(variable) if config.setting(variable) else None


def location_settings(fresh: bool = False) -> dict[str, Any]:
    """The settings of the location's policy file (``$ZOMBIE_POLICY_FILE``), those it changes from the defaults;
    none without a file. Read once per process and file, unless ``fresh``."""
    path = config.policy_file()
    if path is None:
        return {}
    if fresh:
        _settings_of_file.cache_clear()
    return dict(_settings_of_file(path))


@functools.cache
def _settings_of_file(path: Path) -> tuple[tuple[str, Any], ...]:
    policy = policy_from_file(path)
    return tuple(policy.model_dump(include=set(PolicySettings.model_fields), exclude_defaults=True).items())


def policy_from_env() -> ZombiePolicyResource:
    """The location's policy: ``$ZOMBIE_POLICY_FILE`` when set (read and checked now, when the location loads: a bad
    file fails the load in one line, before any run writes anything), else the defaults. Every run of the location
    takes it (schedules, sensors, checks); the UI shows its settings as the resource's config."""
    return ZombiePolicyResource(**location_settings())


def resources_from_env() -> DeploymentResources:
    """The resources of the deployment, from the environment (URLs stay there)."""
    config.mongo_timeout_ms(DEFAULT_TIMEOUT_MS)  # a malformed value is refused when the code location loads
    return {
        "databases": Databases(
            queue_url=url_from_env(config.QUEUE_URL_ENV),
            cache_url=url_from_env(config.CACHE_URL_ENV),
            queue_database=config.queue_database(),
            cache_database=config.cache_database(),
        ),
        "zombie_policy": policy_from_env(),
        "failure_webhook": FailureWebhook(url=url_from_env(config.WEBHOOK_URL_ENV)),
        "metrics_gateway": metrics_gateway_from_env(),
    }
