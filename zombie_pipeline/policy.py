"""The rules of a cleanup and of the T2 suggestions: validated models, defined once.

Dagster's resource and run config inherit these models (``orchestration/``), the
simulator takes a :class:`ZombiePolicy`, and a bad value fails before anything
is read or written, with every offending field named at once.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from zombie_pipeline.queue.documents import (
    DEFAULT_ZOMBIE_HTTP_STATUS,
    ErrorCode,
    job_type_problem,
)
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, QUEUE_GENERATIONS

#: What a bad policy or bad rules raise when built; its message names each offending field.
PolicyError = ValidationError
#: How a message from :func:`validated` begins.
INVALID_POLICY = "invalid zombie policy: "


class InvalidPolicy(ValueError):
    """A policy refused, in one line that names each offending field with the value it was given.

    What a person reads where the policy is configured (the CLI, a run's failure, the failure webhook):
    pydantic's own message spans several lines per field and links to its documentation.
    """


class ZombiePolicy(BaseModel):
    """When a started job is a zombie, and how a cleanup finalizes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    heartbeat_timeout_seconds: int = Field(
        default=300,
        gt=0,
        description="A job is dead after this long without a heartbeat (or, never heartbeated, since its start).",
    )
    max_duration_seconds: int = Field(default=1200, gt=0, description="Default maximum duration (T2) of a job.")
    max_duration_seconds_by_type: dict[str, int] = Field(
        default_factory=dict, description="T2 per job type, overriding max_duration_seconds."
    )
    max_stale_fraction: float = Field(
        default=0.5, gt=0, le=1, description="Brake: refuse to act when more than this share of started jobs look dead."
    )
    min_started_for_brake: int = Field(
        default=20, ge=0, description="The brake applies from this many started jobs on."
    )
    crashed_retry_limit: int = Field(default=3, ge=0, description="Automatic retries after JobManagerCrashedError.")
    exceeded_retry_limit: int = Field(
        default=0, ge=0, description="Automatic retries after JobManagerExceededMaximumDurationError."
    )
    http_status: int = Field(
        default=DEFAULT_ZOMBIE_HTTP_STATUS, ge=400, le=599, description="http_status of the cache error entry."
    )
    batch_size: int = Field(default=500, gt=0, description="Documents per bulk write.")
    claim_lease_seconds: int = Field(
        default=300, ge=0, description="After this long, an unfinished finalization of a crashed run is taken over."
    )
    queue_generation: str | None = Field(
        default=None,
        description=f"Queue generation of the deployment ({', '.join(QUEUE_GENERATIONS)}); unset: detected from the database.",
    )
    cache_generation: str | None = Field(
        default=None,
        description=f"Cache document generation to write ({', '.join(CACHE_GENERATIONS)}); unset: detected.",
    )
    enqueue_retries: bool | None = Field(
        default=None,
        description="Re-enqueue crashed jobs below their retry limit; unset: as the generation does (yes before 2023-12, "
        "no after: the deployment's backfill re-creates failed jobs).",
    )
    transactions: bool = Field(
        default=False,
        description="Write a batch in three transactions (its cache entries, its finish with the deployment's "
        "counters, its retries with the events' completion), where the server has them (a replica set). Off (the "
        "default): one write after the other, and a run that takes over a dead one sets the counters it may have "
        "moved from a recount; exact either way. On, a cleanup killed in a transaction holds the counters' documents, "
        "and every worker's start and finish with them, until the server's transaction lifetime (60 s) runs out.",
    )
    use_suggested_max_durations: bool = Field(
        default=False, description="Take per-type T2 from the latest statistics suggestions (opt-in)."
    )
    retry_delay_seconds: int = Field(
        default=0,
        ge=0,
        description="Delay before a crashed job's first retry; 0: at once (the job often died of its pod's size).",
    )
    retry_backoff_factor: float = Field(
        default=2.0, ge=1.0, le=10.0, description="Each further retry waits this many times longer."
    )
    retry_delay_max_seconds: int = Field(default=3_600, ge=0, description="No retry waits longer than this.")
    retry_jitter: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="Delays spread by up to this share either way, so retries do not come all at once.",
    )
    compensation_webhooks: dict[str, str] = Field(
        default_factory=dict,
        description="Job type ('*': every type) -> name of the environment variable holding a URL that each finalized zombie "
        "of that type is POSTed to, once its cache entry is written (the URL itself never enters config).",
    )
    compensation_timeout_seconds: float = Field(
        default=10.0, gt=0, le=120, description="A compensation webhook must answer within this."
    )
    compensation_max_attempts: int = Field(
        default=5, ge=1, description="A failing compensation is tried again by later runs, up to this."
    )

    @model_validator(mode="after")
    def _consistent(self) -> ZombiePolicy:
        problems = []
        timeout = self.heartbeat_timeout_seconds
        limits = {"max_duration_seconds": self.max_duration_seconds} | {
            f"max_duration_seconds_by_type[{job_type!r}]": value
            for job_type, value in self.max_duration_seconds_by_type.items()
        }
        for name, value in limits.items():
            if value <= 0:
                problems.append(f"{name} must be positive, got {value}")
            elif value < timeout:
                problems.append(
                    f"{name} ({value} s) is shorter than heartbeat_timeout_seconds ({timeout} s): "
                    "a job would be killed for running long before a missing heartbeat could be seen"
                )
        for job_type in self.max_duration_seconds_by_type:
            problem = job_type_problem(job_type)
            if problem:
                problems.append(
                    f"max_duration_seconds_by_type has a job type that is not one: {problem} ({job_type!r})"
                )
        for job_type, variable in self.compensation_webhooks.items():
            if job_type != "*" and job_type_problem(job_type):
                problems.append(f"compensation_webhooks has a key that is neither '*' nor a job type: {job_type!r}")
            if not isinstance(variable, str) or not variable.strip():
                problems.append(
                    f"compensation_webhooks[{job_type!r}] must name an environment variable, got {variable!r}"
                )
        if self.queue_generation is not None and self.queue_generation not in QUEUE_GENERATIONS:
            problems.append(
                f"queue_generation must be one of {sorted(QUEUE_GENERATIONS)} or unset, got {self.queue_generation!r}"
            )
        if self.cache_generation is not None and self.cache_generation not in CACHE_GENERATIONS:
            problems.append(
                f"cache_generation must be one of {sorted(CACHE_GENERATIONS)} or unset, got {self.cache_generation!r}"
            )
        if problems:
            raise ValueError("invalid zombie policy: " + "; ".join(problems))
        return self

    def max_duration_of(self, job_type: str) -> int:
        return self.max_duration_seconds_by_type.get(job_type, self.max_duration_seconds)

    def retry_limit_of(self, error_code: str) -> int:
        if error_code == ErrorCode.EXCEEDED_MAX_DURATION:
            return self.exceeded_retry_limit
        return self.crashed_retry_limit

    def retry_delay_of(self, failed_runs: int, spread: float = 0.0) -> float:
        """Seconds before the retry that follows the ``failed_runs``-th failure; ``spread`` in [-1, 1] picks the jitter."""
        if self.retry_delay_seconds == 0:
            return 0.0
        delay = min(
            self.retry_delay_seconds * self.retry_backoff_factor ** max(failed_runs - 1, 0),
            self.retry_delay_max_seconds,
        )
        return max(delay * (1 + self.retry_jitter * spread), 0.0)

    def with_max_durations(self, by_type: dict[str, int]) -> ZombiePolicy:
        """This policy with ``by_type`` replacing the configured T2 of those types."""
        return self.model_copy(
            update={"max_duration_seconds_by_type": {**self.max_duration_seconds_by_type, **by_type}}
        )

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def as_document(self) -> dict[str, Any]:
        """The policy as stored in an audit event: job type names become values, never field names."""
        document = self.model_dump()
        document["max_duration_seconds_by_type"] = [
            {"type": job_type, "seconds": seconds}
            for job_type, seconds in sorted(self.max_duration_seconds_by_type.items())
        ]
        return document


def validated(values: dict[str, Any]) -> ZombiePolicy:
    """The policy of ``values``, or :class:`InvalidPolicy` naming every offending field and its value in one line."""
    try:
        return ZombiePolicy(**values)
    except ValidationError as error:
        raise InvalidPolicy(INVALID_POLICY + one_line(error)) from None


def one_line(error: ValidationError) -> str:
    """Each problem of a validation error as ``field=value: what is wrong``, joined by ``; ``."""
    problems = []
    for problem in error.errors(include_url=False):
        cause = (problem.get("ctx") or {}).get("error")
        if not problem["loc"]:  # a rule across fields: its own message already names them
            text = str(cause) if cause is not None else problem["msg"]
            problems.append(text.removeprefix(INVALID_POLICY))
            continue
        field = problem["loc"][0]
        path = str(field) + "".join(f"[{part!r}]" for part in problem["loc"][1:])
        if problem["type"] == "extra_forbidden":
            problems.append(f"{path} is not a policy field")
            continue
        what = str(cause) if problem["type"] == "value_error" and cause is not None else problem["msg"]
        what = what.removeprefix("Input ").removeprefix("Value error, ")
        problems.append(f"{path}={problem['input']!r}: {what}")
    return "; ".join(problems)


def policy_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that are policy fields (a Dagster resource carries more)."""
    return {name: value for name, value in values.items() if name in ZombiePolicy.model_fields}


class SuggestionRules(BaseModel):
    """How a suggested T2 is derived from the durations of a window (see ``statistics.suggest``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    quantile: float = Field(
        default=0.99, ge=0.5, lt=1.0, description="Quantile of successful durations the T2 is based on."
    )
    margin: float = Field(default=1.5, ge=1.0, le=10.0, description="Safety factor applied to the quantile.")
    min_samples: int = Field(
        default=30, ge=1, description="Successful jobs needed for a suggestion; fewer keep the current T2."
    )
    confidence: float = Field(default=0.95, gt=0.0, lt=1.0, description="Confidence level of the quantile's interval.")
    censored_fraction: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="Share of jobs stopped at T2 from which the suggestion is a lower bound; unset: 1 - quantile.",
    )

    @property
    def censoring_threshold(self) -> float:
        """Stopped jobs from this share on may hide the quantile itself beyond T2."""
        return self.censored_fraction if self.censored_fraction is not None else 1.0 - self.quantile

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.model_dump(include=set(SuggestionRules.model_fields)),
            "censored_fraction": self.censoring_threshold,
        }

    @classmethod
    def of(cls, values: dict[str, Any]) -> SuggestionRules:
        """The rules among ``values`` (a Dagster config carries more)."""
        return cls(**{name: value for name, value in values.items() if name in cls.model_fields})
