"""Run retention, which Dagster's daemon does not do: delete old finished runs with their event logs.

The daemon purges old schedule and sensor ticks (``retention`` in dagster.yaml) but keeps every run and
every event of it forever. The cleanup runs up to 144 times a day and each is followed by a
``queue_health_job`` run, so their history is what grows. This deletes the finished runs of those two jobs
(by default) that ended more than ``--older-than-days`` ago, through the instance's own API, which removes
each run's event log with it. The audit trail of what a cleanup did stays in the queue database
(``zombieEvents``), which outlives the runs. Statistics runs are kept unless named: their
materializations are the assets' history.

Run it where the instance is configured (``DAGSTER_HOME`` with deploy/dagster.yaml and the DAGSTER_PG_*
variables), e.g. daily from a Kubernetes CronJob on the code location's image, which has dagster-postgres (docs/deploy.md,
"Retention of runs"):

    python deploy/purge_runs.py --older-than-days 30 [--job kill_zombies_job ...] [--dry-run]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence

import dagster as dg

DEFAULT_JOBS = ("kill_zombies_job", "queue_health_job")
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
BATCH = 200


def old_runs_filter(job_name: str, older_than_days: float, now: dt.datetime | None = None) -> dg.RunsFilter:
    """The finished runs of ``job_name`` last updated (ended) more than ``older_than_days`` ago."""
    now = now or dt.datetime.now(dt.UTC)
    return dg.RunsFilter(job_name=job_name, statuses=FINISHED, updated_before=now - dt.timedelta(days=older_than_days))


def purge(
    instance: dg.DagsterInstance, jobs: Sequence[str], older_than_days: float, dry_run: bool = False
) -> dict[str, int]:
    """Runs deleted (or, with ``dry_run``, that would be) per job."""
    if older_than_days < 0:
        raise ValueError(f"older_than_days must be 0 or more, got {older_than_days}")
    now = dt.datetime.now(dt.UTC)
    deleted: dict[str, int] = {}
    for job in jobs:
        runs_filter = old_runs_filter(job, older_than_days, now)
        if dry_run:
            deleted[job] = instance.get_runs_count(runs_filter)
            continue
        deleted[job] = 0
        while True:
            records = instance.get_run_records(filters=runs_filter, limit=BATCH)
            for record in records:
                instance.delete_run(record.dagster_run.run_id)
            deleted[job] += len(records)
            if len(records) < BATCH:
                break
    return deleted


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--older-than-days", type=float, required=True, help="keep the runs that ended more recently")
    parser.add_argument(
        "--job", action="append", help=f"a job whose runs to purge (repeat; default: {', '.join(DEFAULT_JOBS)})"
    )
    parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    args = parser.parse_args(argv)
    if args.older_than_days < 0:
        parser.error("--older-than-days must be 0 or more")
    with dg.DagsterInstance.get() as instance:
        counts = purge(instance, args.job or DEFAULT_JOBS, args.older_than_days, args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    for job, count in counts.items():
        print(f"{job}: {verb} {count} runs finished more than {args.older_than_days:g} days ago")
    return 0


if __name__ == "__main__":
    sys.exit(main())
