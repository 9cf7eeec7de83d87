"""``zombie-pipeline``: simulate a queue, run the embedded server, and a demo of the whole pipeline."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from zombie_pipeline import config
from zombie_pipeline.config import SettingError
from zombie_pipeline.queue.connections import DatabaseUnavailable, close_clients
from zombie_pipeline.queue.evidence import GenerationUnknown
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, NEWEST_QUEUE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.queue.secrets import redact
from zombie_pipeline.simulation import embedded
from zombie_pipeline.simulation.simulator import (
    STARTED_KINDS,
    NotOurs,
    Workload,
    WorkloadError,
    check_ours,
    drop_simulation,
    simulate,
    simulated_generation,
)

# Dagster is imported only by the commands that need it: `db` answers in a fraction of a second.


def _store_and_resources():
    """The configured databases, reachable: a refused or closed port fails now (within the resources' timeout), naming the URL."""
    from zombie_pipeline.orchestration.resources import (
        check_databases,
        resources_from_env,
        store_of,
    )

    resources = resources_from_env()
    check_databases(resources["queue_db"], resources["cache_db"])
    return store_of(resources["queue_db"], resources["cache_db"]), resources


def cmd_simulate(args: argparse.Namespace) -> int:
    counts = {
        name: getattr(args, name)
        for name in ("finished", "crashed", "never_heartbeated", "terminated", "overdue", "running", "waiting")
    }
    options = {
        "seed": args.seed,
        "days": args.days,
        "generation": args.generation,
        "cache_generation": args.cache_generation,
    }
    if args.jobs is not None:
        workload = Workload.from_fractions(args.jobs, crashed_fraction=args.crashed_fraction, **options)
    else:
        workload = Workload(**counts, **options)
    store, resources = _store_and_resources()
    check_ours(store, args.overwrite_database)  # before the first write, an index included
    if args.drop:
        drop_simulation(store, args.overwrite_database)
    elif (
        simulated_generation(store) is not None
    ):  # a second queue over the first would share its datasets' locks and keys
        raise NotOurs("these databases already hold a simulated queue; --drop replaces it (nothing was written)")
    store.ensure_indexes()
    result = simulate(store, workload, overwrite=args.overwrite_database)
    print(f"queue: {resources['queue_db'].describe()}  cache: {resources['cache_db'].describe()}")
    print(
        f"a {workload.generation} queue (cache {workload.cache.name}): {workload.total} jobs, {result.cache_entries} cache "
        f"entries, {result.past_jobs} past jobs, in {result.insert_commands} inserts"
    )
    for status, count in sorted(result.jobs_by_status.items()):
        print(f"  {status:<10} {count:>8}")
    zombies = ", ".join(
        f"{len(result.ids[kind])} {kind.replace('_', ' ')}" for kind in STARTED_KINDS if kind != "running"
    )
    print(f"  zombies: {zombies}; {len(result.running_ids)} healthy running")
    return 0


def cmd_workers(args: argparse.Namespace) -> int:
    from zombie_pipeline.queue.evidence import decide
    from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates

    rates = WorkerRates(
        workers=args.workers,
        crash_rate=args.crash_rate,
        overrun_rate=args.overrun_rate,
        speed=args.speed,
        heartbeat_seconds=args.heartbeat_seconds,
    )
    store, resources = _store_and_resources()
    if simulated_generation(store) is None:  # workers write: only into a queue the simulator wrote
        raise NotOurs(
            f"{resources['queue_db'].describe()} holds no simulated queue: simulated workers only run on a queue "
            "zombie-pipeline simulated (zombie-pipeline simulate first)"
        )
    policy = resources["zombie_policy"].policy()
    generation = decide(store, policy).required_queue()
    pool = WorkerPool(store, generation, policy, rates, seed=args.seed)
    print(
        f"{rates.workers} simulated workers on a {generation.name} queue ({pool.adopt_running()} running jobs adopted); Ctrl-C stops them"
    )
    try:
        pool.run(args.duration if args.duration is not None else float("inf"))
    except KeyboardInterrupt:
        pool.stop()
    print(", ".join(f"{count} {name.replace('_', ' ')}" for name, count in sorted(pool.counts.items())))
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    if args.action == "start":
        info = embedded.ensure_server()
        print(f"embedded server running: pid {info.pid}, {info.url}, storage {info.storage_path}")
    elif args.action == "stop":
        info = embedded.stop_server()
        print(f"stopped embedded server pid {info.pid}" if info else "no embedded server was running")
    else:
        info = embedded.running_server()
        if info is None:
            print(f"no embedded server running (state in {embedded.home()})")
            return 1
        print(f"embedded server running: pid {info.pid}, {info.url}, storage {info.storage_path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from zombie_pipeline.app.demo import run_demo

    return run_demo(finished=args.finished, seed=args.seed, fresh=args.fresh, generation=args.generation)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zombie-pipeline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    sim = commands.add_parser(
        "simulate",
        help="fill the queue and cache with a simulated deployment",
        description="Write a simulated deployment (history, zombies of every kind, healthy and waiting jobs) into the "
        "configured databases, exactly as a deployment of the chosen generation stores it. A database holding "
        "documents zombie-pipeline did not write is refused.",
    )
    sim.add_argument(
        "--generation",
        choices=list(QUEUE_GENERATIONS),
        default=NEWEST_QUEUE_GENERATION,
        help="queue generation of the simulated deployment (default: %(default)s, today's)",
    )
    sim.add_argument(
        "--cache-generation",
        choices=list(CACHE_GENERATIONS),
        default=None,
        help="cache generation (default: the one that queue generation's deployment writes)",
    )
    sim.add_argument("--jobs", type=int, help="total jobs; with --crashed-fraction, instead of the counts below")
    sim.add_argument(
        "--crashed-fraction", type=float, default=0.01, help="share of --jobs that crashed (default: %(default)s)"
    )
    sim.add_argument("--finished", type=int, default=2_000, help="finished jobs of the history (default: %(default)s)")
    sim.add_argument(
        "--crashed", type=int, default=20, help="started jobs whose heartbeat stopped long ago (default: %(default)s)"
    )
    sim.add_argument(
        "--never-heartbeated", type=int, default=5, help="started jobs that never heartbeated (default: %(default)s)"
    )
    sim.add_argument(
        "--terminated",
        type=int,
        default=3,
        help="started jobs that got SIGTERM long ago, where jobs record it (default: %(default)s)",
    )
    sim.add_argument(
        "--overdue", type=int, default=5, help="started jobs past their maximum duration (default: %(default)s)"
    )
    sim.add_argument("--running", type=int, default=50, help="healthy started jobs (default: %(default)s)")
    sim.add_argument("--waiting", type=int, default=50, help="waiting jobs (default: %(default)s)")
    sim.add_argument("--days", type=float, default=7.0, help="days the history spans (default: %(default)s)")
    sim.add_argument(
        "--seed", type=int, default=0, help="random seed: the same seed writes the same queue (default: %(default)s)"
    )
    sim.add_argument(
        "--drop", action="store_true", help="drop the simulated databases first (never a database we did not write)"
    )
    sim.add_argument(
        "--overwrite-database",
        metavar="NAME",
        help="the one database holding documents of its own that you deliberately give up to the simulator",
    )
    sim.set_defaults(handler=cmd_simulate)

    workers = commands.add_parser(
        "workers",
        help="simulated workers: keep the simulated queue alive (take, heartbeat, finish, crash)",
        description="Workers that take waiting jobs with the queue's own rules, heartbeat, finish with each type's "
        "duration law and write their cache entries, crashing or running long at the given rates, as the queue's "
        "generation does. Stopped (Ctrl-C or --duration), they finish the jobs they hold. They run only on a queue "
        "zombie-pipeline simulated: any other database is refused.",
    )
    workers.add_argument("--workers", type=int, default=4, help="how many workers (default: %(default)s)")
    workers.add_argument(
        "--crash-rate", type=float, default=0.05, help="share of jobs whose worker dies silently (default: %(default)s)"
    )
    workers.add_argument(
        "--overrun-rate", type=float, default=0.02, help="share of jobs that run past T2 (default: %(default)s)"
    )
    workers.add_argument(
        "--speed", type=float, default=0.05, help="job durations are their type's times this (default: %(default)s)"
    )
    workers.add_argument(
        "--heartbeat-seconds", type=float, default=60.0, help="heartbeat interval (default: %(default)s)"
    )
    workers.add_argument(
        "--duration", type=float, default=None, help="stop after this many seconds (default: until Ctrl-C)"
    )
    workers.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    workers.set_defaults(handler=cmd_workers)

    db = commands.add_parser("db", help="the embedded MongoDB-compatible server")
    db.add_argument("action", choices=["start", "stop", "status"])
    db.set_defaults(handler=cmd_db)

    demo = commands.add_parser("demo", help="simulate a queue if empty, run the pipeline, print a summary")
    demo.add_argument(
        "--generation",
        choices=list(QUEUE_GENERATIONS),
        default=NEWEST_QUEUE_GENERATION,
        help="queue generation of the simulated deployment (default: %(default)s, today's)",
    )
    demo.add_argument(
        "--finished", type=int, default=3_000, help="finished jobs of the simulated history (default: %(default)s)"
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed of the simulation (default: %(default)s)")
    demo.add_argument("--fresh", action="store_true", help="drop the simulated queue and start again")
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (
        embedded.EmbeddedServerError,
        DatabaseUnavailable,
        NotOurs,
        WorkloadError,
        GenerationUnknown,
        SettingError,
    ) as error:
        print(f"zombie-pipeline: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # keep credentials out of whatever reaches the terminal
        print(
            f"zombie-pipeline: {type(error).__name__}: {redact(str(error), config.configured_urls())}", file=sys.stderr
        )
        return 1
    finally:
        close_clients()


if __name__ == "__main__":
    sys.exit(main())
