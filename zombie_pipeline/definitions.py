"""The code location: every domain's jobs, assets, checks, schedules and sensors, with the resources from the
environment.

One package per domain in ``defs/``, each with its own ``Definitions``: the cleanup (``kill_zombies_job``, partitioned
by job type), the watcher that releases each dead job at its deadline, the queue's health after a cleanup, the duration
statistics (with the repeat offenders), lifting a quarantine, and the report of failed runs.
"""

import dagster as dg

from zombie_pipeline.defs import cleanup, failures, health, quarantine, statistics, watch
from zombie_pipeline.defs.resources import resources_from_env
from zombie_pipeline.policy import InvalidPolicy

try:
    resources = resources_from_env()
except InvalidPolicy as refused:  # each refusal on its own line, as `zombie-pipeline policy check` says them
    raise InvalidPolicy("\n".join(refused.lines())) from None

defs = dg.Definitions.merge(
    cleanup.defs,
    watch.defs,
    health.defs,
    statistics.defs,
    quarantine.defs,
    failures.defs,
    dg.Definitions(resources=resources),
)
