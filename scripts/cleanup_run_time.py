"""How long a cleanup of 1,000 zombies takes as a Dagster run: the figure docs/deploy.md sets the runtime limit against.

    .venv/bin/python scripts/cleanup_run_time.py [--zombies 1000] [--repeats 3]

On the embedded server of a project home of its own (a temporary directory, its server stopped at the end): a queue
of today's generation with 10,000 finished jobs and ``--zombies`` crashed ones beside enough healthy started jobs to
keep the brake off, simulated anew for each run, then ``kill_zombies_job`` in process (metrics off), timed from its
launch to its end, and from its first step's start to its last step's end. Prints each run and the median, with the
load of the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import dagster as dg

from zombie_pipeline.config import HOME_ENV


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zombies", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cleanup-run-time-") as home:
        os.environ[HOME_ENV] = home
        try:
            measure(args.zombies, args.repeats)
        finally:
            from zombie_pipeline.queue.embedded import stop_server

            stop_server(Path(home))


def measure(zombies: int, repeats: int) -> None:
    from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
    from zombie_pipeline.defs.pushgateway import MetricsGateway
    from zombie_pipeline.defs.resources import resources_from_env
    from zombie_pipeline.policy import ZombiePolicy
    from zombie_pipeline.simulation.marks import simulated_generation
    from zombie_pipeline.simulation.ownership import drop_simulation
    from zombie_pipeline.simulation.simulator import simulate
    from zombie_pipeline.simulation.workload import Workload, healthy_beside

    deployment = resources_from_env()
    store = deployment["databases"].store()
    resources = {**deployment, "metrics_gateway": MetricsGateway()}
    runs, steps = [], []
    for repeat in range(repeats):
        if simulated_generation(store) is not None:
            drop_simulation(store)
        store.ensure_indexes()
        workload = Workload(
            finished=10_000,
            crashed=zombies,
            never_heartbeated=0,
            terminated=0,
            overdue=0,
            running=healthy_beside(zombies, ZombiePolicy()),
            waiting=50,
            past_cleanups=0,
            seed=repeat,
        )
        simulate(store, workload)
        load = os.getloadavg()[0]
        started = time.monotonic()
        with dg.DagsterInstance.ephemeral() as instance:
            result = kill_zombies_job.execute_in_process(
                resources=resources,
                instance=instance,
                run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
                raise_on_error=False,
            )
            runs.append(time.monotonic() - started)
            times = [
                entry.timestamp
                for entry in instance.all_logs(result.run_id)
                if entry.dagster_event and (entry.dagster_event.is_step_start or entry.dagster_event.is_step_success)
            ]
        steps.append(max(times) - min(times))
        finalized = dict(result.output_for_node("report_cleanup")).get("finalized") if result.success else None
        print(
            f"run {repeat + 1}: {'succeeded' if result.success else 'FAILED'}, {finalized} finalized, "
            f"{runs[-1]:.1f} s from launch to end, {steps[-1]:.1f} s first step to last; load {load:.1f}",
            flush=True,
        )
    print(f"median of {repeats}: {statistics.median(runs):.1f} s from launch to end, "
          f"{statistics.median(steps):.1f} s first step to last ({zombies:,} zombies)")  # fmt: skip


if __name__ == "__main__":
    main()
