"""Dagster resources: the deployment's databases, the cleanup policy, and the failure webhook (the metrics gateway is
in ``defs/pushgateway.py``; its URL carries no credentials and is its config).

A MongoDB URL may carry a password, and Dagster shows resource config in its UI: the deployment's definitions give
the URLs as ``dg.EnvVar`` (the UI shows the variable's name, never its value), or None for the embedded server.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import dagster as dg
import pymongo
from pydantic import Field
from pymongo.database import Database

from zombie_pipeline import config
from zombie_pipeline.config import SettingError
from zombie_pipeline.defs.pushgateway import MetricsGateway, metrics_gateway_from_env
from zombie_pipeline.defs.tags import policy_tags
from zombie_pipeline.policy import (
    InvalidPolicy,
    PolicyFile,
    PolicySettings,
    PolicySource,
    ZombiePolicy,
    read_policy_file,
    validated,
)
from zombie_pipeline.queue import embedded
from zombie_pipeline.queue.audit_documents import (
    DEFAULT_EVENTS_COLLECTION,
    DEFAULT_FAILURES_COLLECTION,
    DEFAULT_SUGGESTIONS_COLLECTION,
)
from zombie_pipeline.queue.cache import DEFAULT_CACHE_COLLECTION, DEFAULT_CACHE_DATABASE
from zombie_pipeline.queue.connections import (
    DEFAULT_TIMEOUT_MS,
    EMBEDDED_TIMEOUT_MS,
    DatabaseUnavailable,
    database_error,
)
from zombie_pipeline.queue.jobs import DEFAULT_JOBS_COLLECTION, DEFAULT_QUEUE_DATABASE
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.targets import DatabaseTargets
from zombie_pipeline.statistics.suggestion_log import effective_policy

StepContext = dg.OpExecutionContext | dg.AssetExecutionContext | dg.AssetCheckExecutionContext


class Databases(dg.ConfigurableResource["Databases"]):
    """The queue database (jobs, and our own collections beside them) and the cache database, on one MongoDB or two:
    a configured ``queue.targets.DatabaseTargets``.

    :meth:`store_for` is how a step reaches them: checked first, and any database error within the step said in one
    line (the masked URL, what the step was doing, the setting that bounds every wait).
    """

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
        f"else {DEFAULT_TIMEOUT_MS} for a URL, {EMBEDDED_TIMEOUT_MS} for the embedded default).",
    )

    def targets(self) -> DatabaseTargets:
        """Where the databases are, as configured (an ``EnvVar`` read now, outside a run)."""
        return DatabaseTargets(
            queue_url=_value(self.queue_url),
            cache_url=_value(self.cache_url),
            queue_database=self.queue_database,
            cache_database=self.cache_database,
            jobs_collection=self.jobs_collection,
            cache_collection=self.cache_collection,
            events_collection=self.events_collection,
            failures_collection=self.failures_collection,
            suggestions_collection=self.suggestions_collection,
            timeout_ms=self.timeout_ms,
        )

    def urls(self) -> list[str | None]:
        """The configured URLs (None: the embedded default), queue first: what messages mask."""
        return self.targets().urls()

    def wait_ms(self) -> int:
        """The longest bound on a wait: this config's, else ``$ZOMBIE_MONGO_TIMEOUT_MS``, else each URL's default."""
        return self.targets().wait_ms()

    def timeouts(self) -> dict[str | None, int]:
        """Each URL's bound on every wait (``DatabaseTargets.timeout_of``)."""
        return self.targets().timeouts()

    def queue(self) -> Database[Any]:
        return self.targets().queue()

    def cache(self) -> Database[Any]:
        return self.targets().cache()

    def store(self) -> Store:
        """The collections of both databases, unchecked (a sensor checks what it reads itself)."""
        return self.targets().store()

    def check_reachable(self, cache: bool = True) -> None:
        """:class:`DatabaseUnavailable`, one line naming the variable and the masked URL, for a database out of reach
        (the queue's; the cache's too unless ``cache=False``)."""
        self.targets().check_reachable(cache)

    @contextlib.contextmanager
    def store_for(self, context: StepContext, doing: str) -> Iterator[Store]:
        """The store of a step, checked; every database error in the block a one-line :class:`dagster.Failure`, with
        what it was doing and where as metadata.

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
                raise dg.Failure(description=str(error), metadata={"doing": doing}, allow_retries=False) from None
            except embedded.EmbeddedServerError as error:  # not installed, or would not start: said as it is
                metadata = {"doing": doing, "embedded_server_home": str(config.home())}
                raise dg.Failure(description=str(error), metadata=metadata, allow_retries=False) from None
            except DatabaseUnavailable as error:
                raise _unavailable(error) from None
            except pymongo.errors.PyMongoError as error:
                raise _unavailable(database_error(error, doing, self.urls(), self.timeouts())) from None
        except dg.Failure as failure:
            if failure.allow_retries and _last_attempt(context):
                raise dg.Failure(failure.description, failure.metadata, allow_retries=False) from None
            if failure.allow_retries:  # the cause in a line of its own: Dagster's retry event buries it in frames
                context.log.warning(f"{failure.description} ({_attempt(context)}: the step is tried again)")
            raise

    def describe(self) -> dict[str, str]:
        """Where each database is, without credentials."""
        return self.targets().describe()


def _value(url: str | None) -> str | None:
    """A URL as configured: an ``EnvVar`` Dagster has not resolved (the resource used outside a run: the CLI, the
    demo) is read from the environment here."""
    return url.get_value() if isinstance(url, dg.EnvVar) else url


def _unavailable(error: DatabaseUnavailable) -> dg.Failure:
    """A step's failure for a database error: the one line, and where it looked and how long, as metadata; retried
    by the step's policy only if waiting may help (a refused password is not)."""
    return dg.Failure(description=str(error), metadata=dict(error.facts), allow_retries=error.transient)


def _attempt(context: StepContext) -> str:
    """``attempt 1 of 3``: which attempt of a step with a retry policy this is."""
    step = context.op_execution_context
    policy = step.op_def.retry_policy
    return f"attempt {step.retry_number + 1} of {(policy.max_retries if policy else 0) + 1}"


def _last_attempt(context: StepContext) -> bool:
    """Whether a step's retry policy has no retry left for it (True for a step without one)."""
    step = context.op_execution_context
    policy = step.op_def.retry_policy
    return policy is None or step.retry_number >= policy.max_retries


class PolicyRefused(dg.Failure, InvalidPolicy):
    """A run's failure for a policy that is refused: one line naming each field and value, never retried; each
    refusal and where the policy came from as metadata."""

    def __init__(self, error: InvalidPolicy, source: PolicySource | None = None) -> None:
        metadata: dict[str, Any] = {"refused": dg.MetadataValue.json(list(error.problems) or [str(error)])}
        if source is not None:
            metadata["policy_source"] = source.describe()
        super().__init__(description=str(error), metadata=metadata, allow_retries=False)


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
        try:
            return validated({**location_settings(fresh), **self._given()})
        except InvalidPolicy as error:
            raise PolicyRefused(error, self.source()) from None

    def source(self) -> PolicySource:
        """Where :meth:`policy` comes from: the location's file or the defaults, and the fields this run's config sets
        to other values."""
        base = location_settings()
        overrides = [name for name, value in self._given().items() if value != base.get(name, _default_of(name))]
        return PolicySource.of(location_file(), overrides)

    def record_source(self, context: StepContext) -> PolicySource:
        """:meth:`source` as the run's tags (the run page shows them; the runs list filters by them)."""
        source = self.source()
        context.instance.add_run_tags(context.op_execution_context.run_id, policy_tags(source))
        return source

    def _given(self) -> dict[str, Any]:
        return self.model_dump(include=self.model_fields_set & set(PolicySettings.model_fields))

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


def location_file(fresh: bool = False) -> PolicyFile | None:
    """The location's policy file (``$ZOMBIE_POLICY_FILE``) as read, or None without one. Read once per process and
    file, unless ``fresh``: a run's process reads it when it loads the location, and its hash names what that run
    took."""
    path = config.policy_file()
    if path is not None and fresh:
        _read_file.cache_clear()
    return None if path is None else _read_file(path)


@functools.cache
def _read_file(path: Path) -> PolicyFile:
    return read_policy_file(path)


def location_settings(fresh: bool = False) -> dict[str, Any]:
    """The settings of the location's policy file, those it changes from the defaults; none without a file. Read
    once per process and file, unless ``fresh``."""
    file = location_file(fresh)
    return (
        {} if file is None else file.policy.model_dump(include=set(PolicySettings.model_fields), exclude_defaults=True)
    )


def _default_of(name: str) -> Any:
    return PolicySettings.model_fields[name].get_default(call_default_factory=True)


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
