"""The rules of a cleanup and of the T2 suggestions: validated models, defined once.

Over 500 lines: each setting is a field with its description and its bound, which operators read in the
launchpad; the bounds are checked here once.

Dagster's resource and run config inherit these models (``defs/``), the
simulator takes a :class:`ZombiePolicy`, and a bad value fails before anything
is read or written, with every offending field named at once.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from zombie_pipeline.messages import shown
from zombie_pipeline.queue.cache import DEFAULT_ZOMBIE_HTTP_STATUS, DEPLOYMENT_MAX_FAILED_RUNS, ErrorCode
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import job_type_problem
from zombie_pipeline.queue.reasons import Cause

#: What a bad policy or bad rules raise when built; its message names each offending field.
PolicyError = ValidationError
#: How a message from :func:`validated` begins.
INVALID_POLICY = "invalid zombie policy: "
INVALID_RULES = "invalid suggestion rules: "


class InvalidPolicy(ValueError):
    """A policy refused, in one line that names each offending field with the value it was given.

    What a person reads where the policy is configured (the CLI, a run's failure, the failure webhook):
    pydantic's own message spans several lines per field and links to its documentation. ``problems``: each
    refusal on its own (``field=value: why``), for :meth:`lines`; ``where``: the file they were found in.
    """

    def __init__(self, message: str, problems: Sequence[str] = (), where: str | None = None) -> None:
        super().__init__(message)
        self.problems = tuple(problems)
        self.where = where

    def lines(self) -> list[str]:
        """Each refusal as a line of its own, naming the file: what ``policy check`` prints, and the location's load
        error says."""
        if not self.problems:
            return [str(self)]
        where = f"{self.where}: " if self.where else ""
        return [f"{INVALID_POLICY}{where}{problem}" for problem in self.problems]


class PolicyProblems(ValueError):
    """The rules across fields a policy breaks, each on its own (a model validator's error, kept whole by pydantic)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__(INVALID_POLICY + "; ".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True)
class Bound:
    """Where a setting's value must lie: above ``gt`` or from ``ge``, below ``lt`` or up to ``le``."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def problem(self, value: float) -> str | None:
        """What is wrong with ``value``, in the words pydantic uses for its own bounds; None when it lies within."""
        if self.gt is not None and not value > self.gt:
            return f"should be greater than {self.gt:g}"
        if self.ge is not None and not value >= self.ge:
            return f"should be greater than or equal to {self.ge:g}"
        if self.lt is not None and not value < self.lt:
            return f"should be less than {self.lt:g}"
        if self.le is not None and not value <= self.le:
            return f"should be less than or equal to {self.le:g}"
        return None


def within(value: Any, bound: Bound) -> Any:
    """``value`` if it lies within ``bound`` (an unset optional setting does), else ``ValueError`` saying why: a
    field validator's answer, so that pydantic names the field and its value."""
    problem = bound.problem(value) if value is not None else None
    if problem:
        raise ValueError(problem)
    return value


class PolicySettings(BaseModel):
    """The policy's settings as configured: names, types, defaults and descriptions (Dagster's config derives from
    them); their bounds and the rules across them are :class:`ZombiePolicy`'s to check."""

    model_config = ConfigDict(extra="forbid")

    heartbeat_timeout_seconds: int = Field(
        default=300,
        description="A job is dead after this long without a heartbeat (or, never heartbeated, since its start).",
    )
    termination_grace_seconds: int | None = Field(
        default=120,
        description="How long the deployment's pods may take to stop after a SIGTERM before they are killed (its "
        "terminationGracePeriodSeconds: 120 s at most in its production chart). A job SIGTERMed this long ago whose "
        "heartbeats stopped termination_missed_heartbeats intervals ago is dead; unset: only once "
        "heartbeat_timeout_seconds has passed since the SIGTERM, as the deployment decides.",
    )
    termination_missed_heartbeats: int = Field(
        default=2,
        description="Heartbeats a SIGTERMed job must have missed, past its grace period, to be dead "
        "(heartbeats continue until the pod is killed).",
    )
    heartbeat_interval_seconds: int = Field(
        default=60, description="How often the deployment's workers heartbeat (its heartbeatIntervalSeconds)."
    )
    watch_deadlines: bool = Field(
        default=True,
        description="Release each dead job at its deadline: a standing zombie_watch_job run, kept running by "
        "zombie_watch_sensor wherever a Dagster daemon runs, acts within seconds of the moment the rules allow "
        "(docs/detection.md). false: no watcher; stale_jobs_sensor and kill_zombies_schedule alone, as before.",
    )
    deployment_max_missing_heartbeats: int | None = Field(
        default=5,
        description="The deployment's own maxMissingHeartbeats (the production chart: 5): its executors take a job for "
        "dead after this many heartbeat_interval_seconds without a heartbeat. A heartbeat timeout the statistics "
        "suggest below that product is flagged: the deployment's executors would still consider the job alive. "
        "None: not known.",
    )
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
        default=1,
        description="Re-runs of a job stopped at its maximum duration (cause timeout), each at +20 difficulty, while "
        "the failed runs of its artifact at its revision are at most this; enqueued by the cleanup at every generation "
        "(the deployment's backfill never re-runs JobManagerExceededMaximumDurationError). 0: never, as the deployment.",
    )
    deployment_max_job_duration_seconds: int | None = Field(
        default=2400,
        description="The deployment's own MAX_JOB_DURATION_SECONDS (the production chart: 2400): its executors stop "
        "their job this long after its start, at a check every 30-90 s. A timeout's re-run waits until then + 90 s, "
        "so that it never runs beside the process it replaces (a T2 below the deployment's frees the job first); "
        "None: at once (executors that never stop their jobs).",
    )
    deploy_costs_failed_run: bool = Field(
        default=False,
        description="A deploy death (SIGTERMed, or stopped in a wave of workers) counts a failed run and raises the "
        "next run's difficulty like a crash, as the deployment does. False: its cache entry keeps the failed runs it "
        "had, and the cleanup re-enqueues it at once at the same difficulty, at every generation.",
    )
    lone_sigterm_free_reruns: int | None = Field(
        default=DEPLOYMENT_MAX_FAILED_RUNS[ErrorCode.CRASHED],
        description="Free re-runs of a (dataset, job type) within quarantine_window_hours for deaths that are deploy "
        "deaths only by their own SIGTERM (not in a wave): node-pressure eviction, a failed liveness probe, a node "
        "drain or a preemption SIGTERM one pod too. Past them, the next such death is charged as the crash it most "
        "likely is (a failed run, so +20 difficulty at the backfill's next run) and counts towards the quarantine. "
        "Default: the deployment's own limit of failed runs for JobManagerCrashedError (3). Deaths in a wave stay "
        "free. None: every lone SIGTERM is free.",
    )
    wave_min_workers: int = Field(
        default=10,
        description="A deploy wave: at least this many dead workers (of as many datasets) whose last signs of life "
        "(heartbeat, else start) fall within wave_window_seconds of each other, counting the zombies finalized in the "
        "last hour too.",
    )
    wave_window_seconds: int = Field(
        default=60,
        description="The span a deploy wave's last signs of life fall within (see wave_min_workers): one heartbeat "
        "interval holds the last beats of workers stopped at the same instant.",
    )
    quarantine_after_crashes: int = Field(
        default=3,
        description="A (dataset, job type) finalized as a crash this many times within quarantine_window_hours is "
        "quarantined: not re-enqueued again, its cache error saying so. 0: never.",
    )
    quarantine_window_hours: int = Field(default=72, description="The window the crashes of a quarantine fall within.")
    quarantine_lapse_hours: int = Field(
        default=168,
        description="A quarantine lapses this long after it began (unless lifted before by lift_quarantine_job): its "
        "crashes are counted afresh from then on.",
    )
    http_status: int = Field(default=DEFAULT_ZOMBIE_HTTP_STATUS, description="http_status of the cache error entry.")
    batch_size: int = Field(default=500, description="Documents per bulk write.")
    claim_lease_seconds: int = Field(
        default=300, description="After this long, an unfinished finalization of a crashed run is taken over."
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
        description="Delay before a crashed job's first retry; 0: at once (the job often died of its pod's size).",
    )
    retry_backoff_factor: float = Field(default=2.0, description="Each further retry waits this many times longer.")
    retry_delay_max_seconds: int = Field(default=3_600, description="No retry waits longer than this.")
    retry_jitter: float = Field(
        default=0.1,
        description="Delays spread by up to this share either way, so retries do not come all at once.",
    )
    late_result_window_hours: int = Field(
        default=24,
        description="How long after its finalization a job is watched for signs of life (a heartbeat, its own "
        "result): each one found is a late result, a mistake recorded on its event and counted.",
    )
    compensation_webhooks: dict[str, str] = Field(
        default_factory=dict,
        description="Job type ('*': every type) -> name of the environment variable holding a URL that each finalized zombie "
        "of that type is POSTed to, once its cache entry is written (the URL itself never enters config).",
    )
    compensation_timeout_seconds: float = Field(
        default=10.0, description="A compensation webhook must answer within this."
    )
    compensation_max_attempts: int = Field(
        default=5, description="A failing compensation is tried again by later runs, up to this."
    )


#: The bounds of the policy's settings, checked once, by :class:`ZombiePolicy` (a run's first step builds it): a value
#: out of bounds fails that step in one line, never the run's resource setup (which run retries would repeat).
POLICY_BOUNDS: dict[str, Bound] = {
    "heartbeat_timeout_seconds": Bound(gt=0),
    "termination_grace_seconds": Bound(ge=0),
    "termination_missed_heartbeats": Bound(ge=1),
    "heartbeat_interval_seconds": Bound(gt=0),
    "deployment_max_missing_heartbeats": Bound(ge=1),
    "max_duration_seconds": Bound(gt=0),
    "max_stale_fraction": Bound(gt=0, le=1),
    "min_started_for_brake": Bound(ge=0),
    "crashed_retry_limit": Bound(ge=0),
    "exceeded_retry_limit": Bound(ge=0),
    "deployment_max_job_duration_seconds": Bound(gt=0),
    "lone_sigterm_free_reruns": Bound(ge=0),
    "wave_min_workers": Bound(ge=2),
    "wave_window_seconds": Bound(gt=0, le=3_600),
    "quarantine_after_crashes": Bound(ge=0),
    "quarantine_window_hours": Bound(gt=0, le=8_760),
    "quarantine_lapse_hours": Bound(gt=0, le=8_760),
    "http_status": Bound(ge=400, le=599),
    "batch_size": Bound(gt=0),
    "claim_lease_seconds": Bound(ge=0),
    "retry_delay_seconds": Bound(ge=0),
    "retry_backoff_factor": Bound(ge=1, le=10),
    "retry_delay_max_seconds": Bound(ge=0),
    "retry_jitter": Bound(ge=0, le=1),
    "late_result_window_hours": Bound(ge=1, le=720),
    "compensation_timeout_seconds": Bound(gt=0, le=120),
    "compensation_max_attempts": Bound(ge=1),
}


class ZombiePolicy(PolicySettings):
    """When a started job is a zombie, and how a cleanup finalizes it: the settings, checked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator(*POLICY_BOUNDS)
    @classmethod
    def _within_bounds(cls, value: Any, info: ValidationInfo) -> Any:
        return within(value, POLICY_BOUNDS[str(info.field_name)])

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
            raise PolicyProblems(problems)
        return self

    def termination_silence_seconds(self) -> int:
        """How long a SIGTERMed job's heartbeats must have stopped, past its grace period, for it to be dead."""
        return self.termination_missed_heartbeats * self.heartbeat_interval_seconds

    def deployment_heartbeat_timeout_seconds(self) -> int | None:
        """After how long without a heartbeat the deployment's own executors take a job for dead; None: not known."""
        if self.deployment_max_missing_heartbeats is None:
            return None
        return self.deployment_max_missing_heartbeats * self.heartbeat_interval_seconds

    def max_duration_of(self, job_type: str) -> int:
        return self.max_duration_seconds_by_type.get(job_type, self.max_duration_seconds)

    def retry_limit_of(self, error_code: str) -> int:
        if error_code == ErrorCode.EXCEEDED_MAX_DURATION:
            return self.exceeded_retry_limit
        return self.crashed_retry_limit

    @property
    def costless_causes(self) -> frozenset[str]:
        """The causes whose death costs no failed run: a deploy's, unless ``deploy_costs_failed_run``."""
        return frozenset() if self.deploy_costs_failed_run else frozenset({Cause.DEPLOY})

    @property
    def lone_sigterm_limit(self) -> int | None:
        """The free re-runs of a (dataset, job type) SIGTERMed alone, or None when they are not limited: unset, or
        no deploy death is free (``deploy_costs_failed_run``)."""
        return None if self.deploy_costs_failed_run else self.lone_sigterm_free_reruns

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


#: Where the report's ready-to-paste snippet puts the settings (``resources: zombie_policy: config:``).
SNIPPET_PATH = ("resources", "zombie_policy", "config")
#: How many hex digits of a policy file's SHA-256 name its content (in run tags and summaries).
DIGEST_LENGTH = 12


@dataclass(frozen=True)
class PolicyFile:
    """A policy file as read: its path, the SHA-256 of the bytes read, the settings it gives, the policy they make."""

    path: Path
    sha256: str
    settings: dict[str, Any]
    policy: ZombiePolicy

    @property
    def digest(self) -> str:
        return self.sha256[:DIGEST_LENGTH]


def read_policy_file(path: Path) -> PolicyFile:
    """The policy a YAML (or JSON) file holds: its settings at the top, or the statistics report's snippet pasted
    whole (``resources: zombie_policy: config: ...``); :class:`InvalidPolicy` naming the file when it is missing, cannot
    be read, or a value is refused (every refused value at once)."""
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        raise InvalidPolicy(f"{INVALID_POLICY}{path} does not exist") from None
    except IsADirectoryError:
        raise InvalidPolicy(f"{INVALID_POLICY}{path} is a directory, not a policy file") from None
    except OSError as error:
        raise InvalidPolicy(f"{INVALID_POLICY}{path} cannot be read: {error.strerror or error}") from None
    try:
        loaded = yaml.safe_load(content)
    except yaml.YAMLError as error:
        raise InvalidPolicy(f"{INVALID_POLICY}{path} is not valid YAML: {' '.join(str(error).split())}") from None
    settings = loaded if loaded is not None else {}
    for key in SNIPPET_PATH:
        if isinstance(settings, dict) and set(settings) == {key}:
            settings = settings[key] or {}
    if not isinstance(settings, dict):
        raise InvalidPolicy(
            f"{INVALID_POLICY}{path} must hold a mapping of policy settings, got {type(settings).__name__}"
        )
    try:
        policy = validated(settings)
    except InvalidPolicy as error:
        raise InvalidPolicy(
            f"{INVALID_POLICY}{path}: {str(error).removeprefix(INVALID_POLICY)}", error.problems, str(path)
        ) from None
    return PolicyFile(path, hashlib.sha256(content).hexdigest(), settings, policy)


def policy_from_file(path: Path) -> ZombiePolicy:
    """The policy of :func:`read_policy_file`."""
    return read_policy_file(path).policy


@dataclass(frozen=True)
class PolicySource:
    """Where the policy of a run came from: the location's policy file (its path and the hash of what was read) or
    the defaults, and the fields the run's own config set to other values (a Launchpad run's)."""

    path: str | None = None
    digest: str | None = None
    overrides: tuple[str, ...] = ()

    @classmethod
    def of(cls, file: PolicyFile | None, overrides: Sequence[str] = ()) -> PolicySource:
        if file is None:
            return cls(overrides=tuple(sorted(overrides)))
        return cls(str(file.path), file.digest, tuple(sorted(overrides)))

    def describe(self) -> str:
        """``file /etc/policy.yaml (sha256 1a2b3c4d5e6f)`` or ``default``, then the run config's overrides."""
        text = f"file {self.path} (sha256 {self.digest})" if self.path else "default"
        return text + (f", run config overrides {', '.join(self.overrides)}" if self.overrides else "")


def validated(values: dict[str, Any]) -> ZombiePolicy:
    """The policy of ``values``, or :class:`InvalidPolicy` naming every offending field and its value in one line."""
    try:
        return ZombiePolicy(**values)
    except ValidationError as error:
        problems = problems_of(error)
        raise InvalidPolicy(INVALID_POLICY + "; ".join(problems), problems) from None


def one_line(error: ValidationError) -> str:
    """Each problem of a validation error as ``field=value: what is wrong``, joined by ``; ``."""
    return "; ".join(problems_of(error))


def problems_of(error: ValidationError) -> list[str]:
    """Each problem of a validation error as ``field=value: what is wrong``; a field that is none names the one it
    looks like."""
    problems: list[str] = []
    for problem in error.errors(include_url=False):
        cause = (problem.get("ctx") or {}).get("error")
        if not problem["loc"]:  # a rule across fields: its own message already names them
            if isinstance(cause, PolicyProblems):
                problems.extend(cause.problems)
                continue
            text = str(cause) if cause is not None else problem["msg"]
            problems.append(text.removeprefix(INVALID_POLICY).removeprefix(INVALID_RULES))
            continue
        field = problem["loc"][0]
        path = str(field) + "".join(f"[{part!r}]" for part in problem["loc"][1:])
        if problem["type"] == "extra_forbidden":
            problems.append(f"{path} is not a policy field{did_you_mean(str(field), PolicySettings.model_fields)}")
            continue
        what = str(cause) if problem["type"] == "value_error" and cause is not None else problem["msg"]
        what = what.removeprefix("Input ").removeprefix("Value error, ")
        problems.append(f"{path}={shown(problem['input'])}: {what}")
    return problems


def did_you_mean(word: str, known: Sequence[str] | Any) -> str:
    """`` (did you mean X?)`` naming the one of ``known`` that ``word`` looks like, or nothing."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.7)
    return f" (did you mean {close[0]}?)" if close else ""


class SuggestionSettings(BaseModel):
    """How a suggested T2 is derived from the durations of a window, as configured (``statistics.analysis``); their
    bounds are :class:`SuggestionRules`'s to check."""

    quantile: float = Field(default=0.99, description="Quantile of successful durations the T2 is based on.")
    margin: float = Field(default=1.5, description="Safety factor applied to the quantile.")
    min_samples: int = Field(
        default=30, description="Successful jobs needed for a suggestion; fewer keep the current T2."
    )
    confidence: float = Field(default=0.95, description="Confidence level of the quantile's interval.")
    censored_fraction: float | None = Field(
        default=None,
        description="Share of jobs stopped at T2 from which the suggestion is a lower bound; unset: 1 - quantile.",
    )


#: The bounds of the suggestion settings, checked by :class:`SuggestionRules`.
SUGGESTION_BOUNDS: dict[str, Bound] = {
    "quantile": Bound(ge=0.5, lt=1),
    "margin": Bound(ge=1, le=10),
    "min_samples": Bound(ge=1),
    "confidence": Bound(gt=0, lt=1),
    "censored_fraction": Bound(gt=0, lt=1),
}


class SuggestionRules(SuggestionSettings):
    """How a suggested T2 is derived from the durations of a window: the settings, checked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator(*SUGGESTION_BOUNDS)
    @classmethod
    def _within_bounds(cls, value: Any, info: ValidationInfo) -> Any:
        return within(value, SUGGESTION_BOUNDS[str(info.field_name)])

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
    def of(cls, settings: SuggestionSettings) -> SuggestionRules:
        """The rules of ``settings`` (a Dagster config carries more), checked: :class:`InvalidPolicy` in one line."""
        try:
            return cls(**settings.model_dump(include=set(SuggestionSettings.model_fields)))
        except ValidationError as error:
            raise InvalidPolicy(INVALID_RULES + one_line(error)) from None
