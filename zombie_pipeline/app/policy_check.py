"""``zombie-pipeline policy check [FILE]``: a policy file checked before a deploy or a restart, as the location will.

Every refusal the location would give at load, each on a line of its own, at once; then the job types the policy
names (the keys of ``max_duration_seconds_by_type`` and ``compensation_webhooks``) against those the deployment has:
a misspelt one (``splits`` for ``/splits``) is accepted by the location, and applies to no job. The deployment's
types are read from the queue when a database answers (its jobs' types and its cache's kinds), else from the
``job_types`` partitions of the Dagster instance (``job_types_sensor`` keeps them). Nothing is written; an embedded
server that is not running is not started.

The exit status tells a deploy pipeline what to do (:class:`Verdict`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from zombie_pipeline import config
from zombie_pipeline.cleanup.detection import known_job_types
from zombie_pipeline.messages import counted, plural
from zombie_pipeline.policy import InvalidPolicy, PolicyFile, did_you_mean, read_policy_file
from zombie_pipeline.queue import embedded
from zombie_pipeline.queue.connections import DatabaseUnavailable
from zombie_pipeline.queue.targets import DatabaseTargets


class Verdict(IntEnum):
    """The exit status of ``policy check``."""

    VALID = 0  # the location loads it, and every job type it names is one the deployment has (or it names none)
    REFUSED = 2  # the location would refuse it at load: the file is missing or unreadable, a field or value refused
    UNKNOWN_JOB_TYPES = 3  # it loads, but names job types the deployment has never had: their settings apply to nothing
    JOB_TYPES_UNCHECKED = 4  # it loads, but no database answered and no Dagster instance knows the job types


@dataclass(frozen=True)
class KnownTypes:
    """The job types the deployment has, and where they were read."""

    types: frozenset[str]
    where: str


def check(path: Path | None, say: Callable[[str], None], refuse: Callable[[str], None]) -> Verdict:
    """Check the policy file at ``path`` (None: ``$ZOMBIE_POLICY_FILE``); what is fine goes to ``say``, each refusal
    to ``refuse``."""
    path = path or config.policy_file()
    if path is None:
        say(f"no policy file given, and {config.POLICY_FILE_ENV} is unset: the location takes the default policy")
        return Verdict.VALID
    try:
        file = read_policy_file(path)
    except InvalidPolicy as refused:
        for line in refused.lines():
            refuse(line)
        return Verdict.REFUSED
    say(f"{path}: loads (sha256 {file.digest}); {_changes(file)}")
    named = named_job_types(file)
    if not named:
        say(f"{path}: names no job type")
        return Verdict.VALID
    known, unreached = deployment_job_types()
    if known is None:
        say(
            f"{path}: the {counted(len(named), 'job type')} it names ({', '.join(sorted(named))}) could not be checked: "
            f"{unreached}"
        )
        return Verdict.JOB_TYPES_UNCHECKED
    unknown = sorted(set(named) - known.types)
    for job_type in unknown:
        refuse(
            f"{path}: {named[job_type]} names a job type the deployment has never had: {job_type!r}"
            f"{_like(job_type, known.types)}; its setting applies to no job"
        )
    if unknown:
        return Verdict.UNKNOWN_JOB_TYPES
    say(
        f"{path}: the {counted(len(named), 'job type')} it names {plural(len(named), 'is', 'are')} known ({known.where})"
    )
    return Verdict.VALID


def named_job_types(file: PolicyFile) -> dict[str, str]:
    """The job types the policy names, each with the setting that names it."""
    named = dict.fromkeys(file.policy.max_duration_seconds_by_type, "max_duration_seconds_by_type")
    for job_type in file.policy.compensation_webhooks:
        if job_type != "*":
            named.setdefault(job_type, "compensation_webhooks")
    return named


def deployment_job_types() -> tuple[KnownTypes | None, str]:
    """The deployment's job types, from the queue when it answers, else from the Dagster instance; else None and
    why neither could say."""
    targets = DatabaseTargets.from_env()
    if None in targets.urls() and embedded.running_server() is None:
        unreached = "the embedded server is not running (zombie-pipeline db start), "
    else:
        try:
            targets.check_reachable()
            types = known_job_types(targets.store().jobs, targets.store().cache)
        except DatabaseUnavailable as error:
            unreached = f"{error}; "
        else:
            if types:
                return KnownTypes(frozenset(types), f"the queue at {targets.describe()['queue']}"), ""
            unreached = f"the queue at {targets.describe()['queue']} has no job yet, "
    home = _dagster_home()
    types = _partition_types(home) if home is not None else set()
    if types:
        return KnownTypes(frozenset(types), f"the job_types partitions of the Dagster instance in {home}"), ""
    return None, unreached + "and no Dagster instance holds job_types partitions (job_types_sensor adds them)"


def _dagster_home() -> Path | None:
    """``$DAGSTER_HOME``, else the demo's instance when there is one."""
    home = config.dagster_home()
    return home if (home / "dagster.yaml").exists() or config.setting(config.DAGSTER_HOME_ENV) else None


def _partition_types(home: Path) -> set[str]:
    import dagster as dg

    from zombie_pipeline.defs.tags import JOB_TYPE_PARTITIONS_NAME

    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            return set(instance.get_dynamic_partitions(JOB_TYPE_PARTITIONS_NAME))
    except Exception:  # an instance that cannot be opened here (its storage elsewhere): it says nothing
        return set()


def _like(job_type: str, known: Iterable[str]) -> str:
    """`` (did you mean '/splits'?)``: the known type it looks like, a missing leading slash first."""
    if f"/{job_type}" in known:
        return f" (did you mean '/{job_type}'?)"
    close = did_you_mean(job_type, sorted(known))
    return close.replace("mean ", "mean '").replace("?)", "'?)") if close else ""


def _changes(file: PolicyFile) -> str:
    changed = file.policy.model_dump(exclude_defaults=True)
    if not changed:
        return "it changes nothing from the defaults"
    return f"it changes {counted(len(changed), 'setting')} from the defaults: {', '.join(sorted(changed))}"
