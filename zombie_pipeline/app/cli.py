"""``zombie-pipeline``: simulate a queue, run the embedded server, and a demo of the whole pipeline."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from zombie_pipeline import config, embedded
from zombie_pipeline.generations import CACHE_GENERATIONS, NEWEST_CACHE_GENERATION
from zombie_pipeline.mongo import DatabaseUnavailable, close_clients, redact
from zombie_pipeline.simulate import Workload, simulate

# Dagster is imported only by the commands that need it: `db` answers in a fraction of a second.


def _store_and_resources():
    from zombie_pipeline.orchestration.resources import resources_from_env, store_of

    resources = resources_from_env()
    return store_of(resources["queue_db"], resources["cache_db"]), resources


def cmd_simulate(args: argparse.Namespace) -> int:
    store, resources = _store_and_resources()
    if args.drop:
        store.jobs.drop()
        store.cache.drop()
        store.events.drop()
    store.ensure_indexes()
    if args.jobs is not None:
        workload = Workload.from_fractions(
            args.jobs,
            crashed_fraction=args.crashed_fraction,
            seed=args.seed,
            days=args.days,
            cache_generation=args.cache_generation,
        )
    else:
        workload = Workload(
            finished=args.finished,
            crashed=args.crashed,
            never_heartbeated=args.never_heartbeated,
            overdue=args.overdue,
            running=args.running,
            waiting=args.waiting,
            seed=args.seed,
            days=args.days,
            cache_generation=args.cache_generation,
        )
    result = simulate(store, workload)
    print(f"queue: {resources['queue_db'].describe()}  cache: {resources['cache_db'].describe()}")
    print(f"wrote {workload.total} jobs and {result.cache_entries} cache entries in {result.insert_commands} inserts")
    for status, count in sorted(result.jobs_by_status.items()):
        print(f"  {status:<10} {count:>8}")
    print(
        f"  zombies: {len(result.crashed_ids)} crashed, {len(result.never_heartbeated_ids)} never heartbeated, "
        f"{len(result.overdue_ids)} past their maximum duration; {len(result.running_ids)} healthy running"
    )
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

    return run_demo(finished=args.finished, seed=args.seed, fresh=args.fresh)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zombie-pipeline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    sim = commands.add_parser("simulate", help="fill the queue and cache with a simulated deployment")
    sim.add_argument("--jobs", type=int, help="total jobs; with --crashed-fraction, instead of the counts below")
    sim.add_argument("--crashed-fraction", type=float, default=0.01)
    sim.add_argument("--finished", type=int, default=2_000)
    sim.add_argument("--crashed", type=int, default=20)
    sim.add_argument("--never-heartbeated", type=int, default=5)
    sim.add_argument("--overdue", type=int, default=5)
    sim.add_argument("--running", type=int, default=50)
    sim.add_argument("--waiting", type=int, default=50)
    sim.add_argument("--days", type=float, default=7.0)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--cache-generation", choices=sorted(CACHE_GENERATIONS), default=NEWEST_CACHE_GENERATION)
    sim.add_argument("--drop", action="store_true", help="empty the jobs, cache and audit collections first")
    sim.set_defaults(handler=cmd_simulate)

    db = commands.add_parser("db", help="the embedded MongoDB-compatible server")
    db.add_argument("action", choices=["start", "stop", "status"])
    db.set_defaults(handler=cmd_db)

    demo = commands.add_parser("demo", help="simulate a queue if empty, run the pipeline, print a summary")
    demo.add_argument("--finished", type=int, default=3_000)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--fresh", action="store_true", help="drop the simulated queue and start again")
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (embedded.EmbeddedServerError, DatabaseUnavailable) as error:
        print(f"zombie-pipeline: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # keep credentials out of whatever reaches the terminal
        print(f"zombie-pipeline: {type(error).__name__}: {redact(str(error), config.configured_urls())}", file=sys.stderr)
        return 1
    finally:
        close_clients()


if __name__ == "__main__":
    sys.exit(main())
