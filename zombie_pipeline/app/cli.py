"""``zombie-pipeline``: the queue's status, a policy checked, a simulated queue and its workers, the embedded server, and
a demo of the whole pipeline.

Over 500 lines: the parser of every subcommand (its options and their help are 200 lines) beside each short handler.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pymongo

from zombie_pipeline import config
from zombie_pipeline.app.errors import OptionRefused, Progress, cut_short, progress_of
from zombie_pipeline.config import SettingError
from zombie_pipeline.messages import counted, shown
from zombie_pipeline.policy import InvalidPolicy, PolicySource, ZombiePolicy, read_policy_file
from zombie_pipeline.queue import embedded
from zombie_pipeline.queue.connections import DatabaseUnavailable, close_clients, database_error
from zombie_pipeline.queue.evidence import GenerationUnknown
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, NEWEST_QUEUE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import Job
from zombie_pipeline.queue.secrets import redact
from zombie_pipeline.queue.targets import DatabaseTargets, timeouts_from_env
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.marks import simulated_generation
from zombie_pipeline.simulation.ownership import NotOurs, check_ours, drop_simulation
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workers import QueueClaim, WorkerPool, WorkerRates, WorkersRunning
from zombie_pipeline.simulation.workload import STARTED_KINDS, Workload, WorkloadError, healthy_beside

if TYPE_CHECKING:
    from zombie_pipeline.defs.resources import DeploymentResources
    from zombie_pipeline.queue.store import Store

# Dagster is imported only by the commands that need it: `db` answers in a fraction of a second.


def _store_and_resources() -> tuple[Store, DeploymentResources]:
    """The configured databases, reachable: a refused or closed port fails now (within the resources' timeout), naming the URL."""
    from zombie_pipeline.defs.resources import resources_from_env

    resources = resources_from_env()
    resources["databases"].check_reachable()
    return resources["databases"].store(), resources


#: What ``simulate`` writes unless told otherwise (``None``: the healthy started jobs, sized against the brake).
SIMULATE_DEFAULTS: dict[str, Any] = {
    "finished": 2_000,
    "crashed": 20,
    "never_heartbeated": 5,
    "terminated": 3,
    "overdue": 5,
    "running": None,
    "waiting": 50,
}
COUNT_OPTIONS = tuple(SIMULATE_DEFAULTS)
DEFAULT_CRASHED_FRACTION = 0.01


def option(name: str) -> str:
    """A field's option as typed: ``crashed_fraction`` -> ``--crashed-fraction``."""
    return "--" + name.replace("_", "-")


def given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """The options among ``names`` the command line gave (their defaults are None until then)."""
    return [option(name) for name in names if getattr(args, name, None) is not None]


def cmd_simulate(args: argparse.Namespace) -> int:
    options = {
        "seed": args.seed,
        "days": args.days,
        "generation": args.generation,
        "cache_generation": args.cache_generation,
        "past_cleanups": args.past_days,
    }
    if args.jobs is None and args.crashed_fraction is not None:
        raise OptionRefused("--crashed-fraction applies to --jobs only: give --jobs N too, or the counts (--crashed N)")
    if args.jobs is not None:
        pointless = given(args, COUNT_OPTIONS)
        if pointless:
            raise OptionRefused(
                f"--jobs sets every count from its fractions: {', '.join(pointless)} would have no effect"
            )
        fraction = args.crashed_fraction if args.crashed_fraction is not None else DEFAULT_CRASHED_FRACTION
        workload = Workload.from_fractions(args.jobs, crashed_fraction=fraction, **options)
    else:
        counts: dict[str, Any] = {
            name: SIMULATE_DEFAULTS[name] if getattr(args, name) is None else getattr(args, name)
            for name in COUNT_OPTIONS
        }
        if args.terminated is not None and not QUEUE_GENERATIONS[args.generation].declares(Job.TERMINATED_AT):
            raise OptionRefused(
                f"--terminated has no effect on a {args.generation} queue: its jobs do not record a SIGTERM "
                "(terminated_at, 2026-05 on)"
            )
        if counts["running"] is None:  # enough healthy jobs that a cleanup never sees half the started jobs dead
            dead = Workload(**{**counts, "running": 0}, **options).zombies
            counts["running"] = healthy_beside(dead, ZombiePolicy())
        workload = Workload(**counts, **options)
    store, resources = _store_and_resources()
    progress = progress_of("simulate", resources)
    with progress.watching():
        progress("reading what the databases hold")
        check_ours(store, args.overwrite_database)  # before the first write, an index included
        if not args.drop and simulated_generation(store) is not None:
            # a second queue over the first would share its datasets' locks and keys
            raise NotOurs("these databases already hold a simulated queue; --drop replaces it (nothing was written)")
        progress.then = cut_short("zombie-pipeline simulate --drop")
        if args.drop:  # only once the server took a write (drop_simulation checks), the simulator's marker last
            drop_simulation(store, args.overwrite_database, progress)
        progress("creating the indexes")
        store.ensure_indexes()
        result = simulate(store, workload, overwrite=args.overwrite_database, progress=progress)
    print("  ".join(f"{role}: {where}" for role, where in resources["databases"].describe().items()))
    print(
        f"a {workload.generation} queue (cache {workload.cache.name}): {counted(workload.total, 'job')}, "
        f"{counted(result.cache_entries, 'cache entry')}, {counted(result.past_jobs, 'past job')}, in "
        f"{counted(result.insert_commands, 'insert')}"
    )
    for status, count in sorted(result.jobs_by_status.items()):
        print(f"  {status:<10} {count:>8}")
    zombies = ", ".join(
        f"{len(result.ids[kind])} {kind.replace('_', ' ')}" for kind in STARTED_KINDS if kind != "running"
    )
    print(f"  zombies: {zombies}; {len(result.running_ids)} healthy running")
    if result.past is not None:
        print(
            f"  the {result.past.days} days before: cleaned daily, {counted(result.past.finalized, 'zombie')} finalized, "
            f"{result.past.offender_finalized} of them user42/endless-audio's (a repeat offender)"
        )
    print(
        "  the healthy jobs look alive for the heartbeat timeout (5 minutes by default): keep them alive with "
        "zombie-pipeline workers"
    )
    return 0


def cmd_workers(args: argparse.Namespace) -> int:
    from zombie_pipeline.queue.evidence import decide

    if args.duration is not None and not args.duration > 0:
        raise OptionRefused(f"--duration must be positive, got {shown(args.duration)}")
    rates = WorkerRates(
        workers=args.workers,
        crashes_per_worker_hour=args.crashes_per_worker_hour,
        overruns_per_worker_hour=args.overruns_per_worker_hour,
        restart_seconds=args.restart_seconds,
        speed=args.speed,
        heartbeat_seconds=args.heartbeat_seconds,
        waiting_target=args.waiting_target,
    )
    store, resources = _store_and_resources()
    progress = progress_of("workers", resources)

    def explain(error: pymongo.errors.PyMongoError, doing: str) -> str:
        return str(database_error(error, f"workers: {doing}", progress.urls, progress.timeout_ms, ""))

    with progress.watching():
        progress("reading what the databases hold")
        if simulated_generation(store) is None:  # workers write: only into a queue the simulator wrote
            raise NotOurs(
                f"{resources['databases'].describe()['queue']} holds no simulated queue: simulated workers only run on a queue "
                "zombie-pipeline simulated (zombie-pipeline simulate first)"
            )
        policy = resources["zombie_policy"].policy()
        progress("deciding the queue's generation")
        generation = decide(store, policy).required_queue()
        progress("claiming the queue for these workers")
        claim = QueueClaim.of(store)
        claim.take()  # before any job is adopted: a second process is refused here
        try:
            pool = WorkerPool(store, generation, policy, rates, seed=args.seed, say=_say, explain=explain, claim=claim)
            progress("adopting the healthy started jobs")
            adopted = pool.adopt_running()
        except BaseException:
            with contextlib.suppress(pymongo.errors.PyMongoError):
                claim.release()
            raise
    print(
        f"{pool.workers} simulated workers on a {generation.name} queue ({adopted} running jobs adopted); "
        f"{rates.crashes_per_worker_hour:g} crashes and {rates.overruns_per_worker_hour:g} overruns per worker-hour; "
        "a line a minute of what they do; Ctrl-C (or SIGTERM) stops them, finishing the jobs they hold (twice: at once)",
        flush=True,
    )
    stopping = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:  # the second one stops at once, leaving the jobs held
        if stopping.is_set():
            raise KeyboardInterrupt
        stopping.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        pool.run(args.duration if args.duration is not None else float("inf"), stopping.is_set)
    except KeyboardInterrupt:
        _say(
            f"stopped at once: {counted(pool.held(), 'job')} left started, which look dead after the heartbeat timeout (a cleanup "
            "finalizes them); the workers' claim on the queue expires in "
            f"{claim.expires_seconds:g} s"
        )
        return 130
    except pymongo.errors.PyMongoError as error:
        raise database_error(error, f"workers: {pool.doing}", progress.urls, progress.timeout_ms, "") from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(f"in all: {pool.summary()}")
    return 0


def _say(line: str) -> None:
    """A line of a long-running command, at once (its output may be a file or a pipe)."""
    print(line, flush=True)


def cmd_status(args: argparse.Namespace) -> int:
    from zombie_pipeline.app.status import queue_status, status_text
    from zombie_pipeline.statistics.suggestion_log import effective_policy

    targets = DatabaseTargets.from_env()
    if None in targets.urls() and embedded.running_server() is None:  # reading only: never starts a server
        raise OptionRefused(
            f"no MongoDB URL is set ({config.QUEUE_URL_ENV}, {config.CACHE_URL_ENV}) and the embedded server is not "
            "running: nothing to read (zombie-pipeline db start, or set the URLs)"
        )
    file = config.policy_file()
    source = PolicySource.of(read_policy_file(file) if file else None)
    progress = Progress("status", targets.urls(), targets.timeouts(), then="")
    with progress.watching():
        progress("reaching the databases")
        targets.check_reachable()
        store = targets.store()
        progress("reading the queue and the audit trail")
        policy = effective_policy(read_policy_file(file).policy if file else ZombiePolicy(), store.suggestions)
        status = queue_status(store, policy, utc_now(), targets.describe())
    status["policy"]["source"] = source.describe()
    print(json.dumps(status, indent=2, default=str) if args.json else status_text(status, source.describe()))
    return 0


def cmd_policy(args: argparse.Namespace) -> int:
    from zombie_pipeline.app.policy_check import check

    def refuse(line: str) -> None:
        print(f"zombie-pipeline: {line}", file=sys.stderr)

    return int(check(Path(args.file) if args.file else None, print, refuse))


def cmd_db(args: argparse.Namespace) -> int:
    if args.port is not None and args.action != "start":
        raise OptionRefused(f"--port applies to db start only: db {args.action} finds the server wherever it runs")
    if args.port is not None and not 0 < args.port < 65_536:
        raise OptionRefused(f"--port must be a TCP port (1 to 65535), got {args.port}")
    if args.action == "start":
        started = embedded.ensure_server(port=args.port)
        print(f"embedded server running: pid {started.pid}, {started.url}, storage {started.storage_path}")
        return 0
    if args.action == "stop":
        stopped = embedded.stop_server()
        print(f"stopped embedded server pid {stopped.pid}" if stopped else "no embedded server was running")
        return 0
    info = embedded.running_server()
    if info is None:
        print(f"no embedded server running (state in {config.home()})")
        return 1
    print(f"embedded server running: pid {info.pid}, {info.url}, storage {info.storage_path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from zombie_pipeline.app.demo import DEFAULT_FINISHED, run_demo

    if config.queue_url() or config.cache_url():
        ignored = given(args, ("generation", "finished", "seed")) + (["--fresh"] if args.fresh else [])
        if ignored:
            raise OptionRefused(
                f"a MongoDB URL is set ({config.QUEUE_URL_ENV} or {config.CACHE_URL_ENV}): the demo simulates nothing "
                f"there, so {', '.join(ignored)} would have no effect"
            )
    return run_demo(
        finished=args.finished if args.finished is not None else DEFAULT_FINISHED,
        seed=args.seed if args.seed is not None else 0,
        fresh=args.fresh,
        generation=args.generation or NEWEST_QUEUE_GENERATION,
        refuse_finished=args.finished is not None,
    )


class UsageError(OptionRefused):
    """A command line argparse cannot read: said in one line, with where the options are listed."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a command line it cannot read is one line naming where the options are listed, not its usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="zombie-pipeline",
        description="Zombie jobs of a MongoDB job queue: the queue's status, a policy file checked, a simulated "
        "deployment and its workers, the embedded MongoDB-compatible server, and a demo of the whole pipeline.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    sim = commands.add_parser(
        "simulate",
        help="fill the queue and cache with a simulated deployment",
        description="Write a simulated deployment into the configured databases, exactly as a deployment of the "
        "chosen generation stores it: finished history, the days before today cleaned daily (their audit trail, "
        "cache errors and a repeat offender), today's zombies of every kind beside healthy started jobs, waiting "
        "jobs. A database holding documents zombie-pipeline did not write is refused.",
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
    sim.add_argument(
        "--jobs", type=int, help="total jobs, in the shares the fractions say, instead of the counts below"
    )
    sim.add_argument(
        "--crashed-fraction",
        type=float,
        help=f"with --jobs: the share of them that crashed (default: {DEFAULT_CRASHED_FRACTION})",
    )
    for name, text in (
        ("finished", "finished jobs of the history"),
        ("crashed", "started jobs whose heartbeat stopped long ago"),
        ("never_heartbeated", "started jobs that never heartbeated"),
        ("terminated", "started jobs that got SIGTERM long ago (2026-05 on: jobs record it)"),
        ("overdue", "started jobs alive past their maximum duration"),
        ("waiting", "waiting jobs"),
    ):
        sim.add_argument(option(name), type=int, help=f"{text} (default: {SIMULATE_DEFAULTS[name]})")
    sim.add_argument(
        "--running",
        type=int,
        help="healthy started jobs (default: enough that the zombies are at most a quarter of the started jobs, "
        "half the brake's threshold, and at least 20)",
    )
    sim.add_argument("--days", type=float, default=8.0, help="days the finished history spans (default: %(default)s)")
    sim.add_argument(
        "--past-days",
        type=int,
        default=7,
        help="days before today, each cleaned by a daily cleanup whose audit trail the statistics and "
        "repeat_offenders read; 0: none (default: %(default)s)",
    )
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
    sim.set_defaults(handler=cmd_simulate, command_parser=sim)

    defaults = WorkerRates()
    workers = commands.add_parser(
        "workers",
        help="simulated workers: keep the simulated queue alive (take, heartbeat, finish, crash)",
        description="Workers that take waiting jobs with the queue's own rules, heartbeat, finish with each type's "
        "duration law and write their cache entries, stop a job at its maximum duration as the deployment does, "
        "crash or overrun at the given rates (per hour of a worker's work), and are replaced when they crash, as the "
        "queue's generation does. Each healthy started job of the simulated queue is adopted by a worker of its own. "
        "Stopped (Ctrl-C or --duration), they finish the jobs they hold. They run only on a queue zombie-pipeline "
        "simulated: any other database is refused.",
    )
    workers.add_argument(
        "--workers",
        type=int,
        default=defaults.workers,
        help="at least this many workers, beside one per adopted job (default: %(default)s)",
    )
    workers.add_argument(
        "--crashes-per-worker-hour",
        type=float,
        default=defaults.crashes_per_worker_hour,
        help="how often a worker dies silently, leaving its job a zombie (default: %(default)s)",
    )
    workers.add_argument(
        "--overruns-per-worker-hour",
        type=float,
        default=defaults.overruns_per_worker_hour,
        help="how often a job runs past its maximum duration, its own killer failing (default: %(default)s)",
    )
    workers.add_argument(
        "--restart-seconds",
        type=float,
        default=defaults.restart_seconds,
        help="a crashed worker is replaced after this many seconds (default: %(default)s)",
    )
    workers.add_argument(
        "--speed",
        type=float,
        default=defaults.speed,
        help="job durations are their type's times this (default: %(default)s)",
    )
    workers.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=defaults.heartbeat_seconds,
        help="heartbeat interval (default: %(default)s)",
    )
    workers.add_argument(
        "--waiting-target",
        type=int,
        default=None,
        help="waiting jobs kept in the queue (default: as many as the workers, at least 20)",
    )
    workers.add_argument(
        "--duration", type=float, default=None, help="stop after this many seconds (default: until Ctrl-C)"
    )
    workers.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    workers.set_defaults(handler=cmd_workers, command_parser=workers)

    status = commands.add_parser(
        "status",
        help="how the queue is doing: started jobs, zombies, the last cleanups, quarantines, the last day",
        description="Read the queue and the audit trail (nothing written, in a second or two on a queue of 100,000 "
        "jobs) and say: the started jobs of each type by age against its maximum duration (T2) and silent past the "
        "heartbeat timeout, the zombies a cleanup would finalize now and whether the brake would hold it back, the "
        "last cleanups and what they finalized by cause, the quarantines, the zombies finalized in the last 24 hours "
        "and how long they waited (detection time), the late results and the pipeline's failures of the last day, "
        "the retries waiting for their delay. The policy is the location's ($ZOMBIE_POLICY_FILE, else the defaults).",
    )
    status.add_argument("--json", action="store_true", help="print it as JSON, for scripts and dashboards")
    status.set_defaults(handler=cmd_status, command_parser=status)

    policy = commands.add_parser(
        "policy",
        help="check a policy file before a deploy or a restart",
        description="Check a policy file as the code location will when it loads it: every refusal at once, each on "
        "a line of its own (a missing file, a misspelt field with the one it looks like, a value out of bounds); then "
        "the job types it names against the deployment's (the queue's when a database answers, else the job_types "
        "partitions of the Dagster instance). Exit status: 0 the policy loads and every job type it names is known; "
        "2 the location would refuse it; 3 it names job types the deployment has never had; 4 its job types could "
        "not be checked (no database answered, no Dagster instance knows them).",
    )
    policy.add_argument("action", choices=["check"])
    policy.add_argument("file", nargs="?", metavar="FILE", help="the policy file (default: $ZOMBIE_POLICY_FILE)")
    policy.set_defaults(handler=cmd_policy, command_parser=policy)

    db = commands.add_parser(
        "db",
        help="the embedded MongoDB-compatible server",
        description="Start, stop or show the embedded server of the project home. Started again, it takes the port "
        "it had last, so its URL stays the same.",
    )
    db.add_argument("action", choices=["start", "stop", "status"])
    db.add_argument(
        "--port",
        type=int,
        help="with start: the port on 127.0.0.1 to serve on, remembered for the next starts (default: the port it "
        "had last, else a free one)",
    )
    db.set_defaults(handler=cmd_db, command_parser=db)

    demo = commands.add_parser(
        "demo",
        help="simulate a queue if empty, run the pipeline, print a summary",
        description="On the embedded server: simulate a deployment when the databases hold none (or with --fresh), "
        "run kill_zombies_job, then the statistics and repeat_offenders of the week ending yesterday through Dagster, "
        "with simulated workers moving the queue meanwhile, and print what the runs recorded. With a MongoDB URL set: "
        "a dry run of the cleanup and the statistics, nothing written.",
    )
    demo.add_argument(
        "--generation",
        choices=list(QUEUE_GENERATIONS),
        help=f"queue generation of the simulated deployment (default: {NEWEST_QUEUE_GENERATION}, today's); another "
        "than the queue's replaces it",
    )
    demo.add_argument(
        "--finished",
        type=int,
        help="finished jobs of a new simulated history (default: 8000; with a new simulation only)",
    )
    demo.add_argument("--seed", type=int, help="random seed of the simulation and the workers (default: 0)")
    demo.add_argument("--fresh", action="store_true", help="drop the simulated queue and start again")
    demo.set_defaults(handler=cmd_demo, command_parser=demo)
    return parser


#: The one-line errors of a command: said as they are, naming what to change.
REFUSALS = (
    embedded.EmbeddedServerError,
    DatabaseUnavailable,
    NotOurs,
    WorkloadError,
    GenerationUnknown,
    SettingError,
    InvalidPolicy,
    OptionRefused,
    WorkersRunning,
)


#: Fields of the simulator whose option has another name.
OPTION_OF_FIELD = {"past_cleanups": "past_days"}


def as_typed(message: str, command: argparse.ArgumentParser) -> str:
    """``message`` with each field name that is an option of ``command`` written as the option is typed."""
    options = {
        action.dest: action.option_strings[-1]
        for action in command._actions  # argparse lists a parser's options nowhere else
        if action.option_strings and action.dest != "help"
    }
    for field, dest in OPTION_OF_FIELD.items():
        if dest in options:
            options[field] = options[dest]
    message = message.removeprefix("invalid workload: ").removeprefix("invalid worker rates: ")
    return re.sub(r"(?<![-\w])[a-z][a-z_]*\b", lambda word: options.get(word.group(0), word.group(0)), message)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the command they were given to, whose options the hint lists
            args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except UsageError as error:
        print(f"zombie-pipeline: {error}", file=sys.stderr)
        return 2
    try:
        status: int = args.handler(args)
        return status
    except WorkloadError as error:  # the simulator names its fields: the person typed options
        print(f"zombie-pipeline: {as_typed(str(error), args.command_parser)}", file=sys.stderr)
        return 2
    except REFUSALS as error:
        print(f"zombie-pipeline: {error}", file=sys.stderr)
        return 2
    except pymongo.errors.PyMongoError as error:  # met where no step named itself: the command, still in one line
        print(f"zombie-pipeline: {_database_error(error, args.command)}", file=sys.stderr)
        return 2
    except Exception as error:  # keep credentials out of whatever reaches the terminal
        print(
            f"zombie-pipeline: {type(error).__name__}: {redact(str(error), config.configured_urls())}", file=sys.stderr
        )
        return 1
    finally:
        close_clients()


def _database_error(error: pymongo.errors.PyMongoError, command: str) -> DatabaseUnavailable:
    """A database error no step of ``command`` caught, in the one line of :func:`database_error`."""
    return database_error(error, command, config.configured_urls(), timeouts_from_env(), "")


if __name__ == "__main__":
    sys.exit(main())
