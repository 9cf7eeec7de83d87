"""``python -m benchmarks.run [--quick] [...]``: every measure in one run, results written as they come.

Prints each figure as it is measured and, after every measure, rewrites
``benchmarks-results.json``, ``benchmarks-results.md`` and
``benchmarks-growth.png`` in the output directory (``docs/`` by default,
``build/benchmarks-quick/`` with ``--quick``), so a long run that is stopped
still leaves its figures. See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks import report
from benchmarks.cleanup_bench import CleanupSettings, cleanup_case
from benchmarks.compute_bench import compute_case
from benchmarks.harness import CommandCounter, machine_info, new_client, now_iso, python_command, server
from benchmarks.history_bench import HistoryBench, HistorySettings

REPO = Path(__file__).resolve().parent.parent
RESULTS_JSON = "benchmarks-results.json"
RESULTS_MD = "benchmarks-results.md"
GROWTH_PNG = "benchmarks-growth.png"


@dataclass
class Config:
    mode: str = "full"
    # (queue jobs, zombies); the 10,000-zombie case last: it is the longest
    cleanup_cases: tuple[tuple[int, int], ...] = (
        (10_000, 100),
        (10_000, 1_000),
        (100_000, 100),
        (100_000, 1_000),
        (100_000, 10_000),
    )
    history: HistorySettings = field(default_factory=HistorySettings)
    cleanup: CleanupSettings = field(default_factory=CleanupSettings)
    #: the cleanup cases with at least this many jobs run after the history section
    late_cleanup_from: int = 100_000
    #: per-case caps (seconds) replacing ``cleanup.cap_seconds``
    case_caps: dict[tuple[int, int], float] = field(default_factory=lambda: {(100_000, 10_000): 1_200.0})
    #: statistics step fed from memory (``compute_bench``): its compute target is at 1M jobs
    compute_sizes: tuple[int, ...] = (1_000_000,)
    sections: tuple[str, ...] = ("cleanup", "history", "compute")

    @classmethod
    def full(cls) -> "Config":
        cleanup = CleanupSettings()
        return cls(history=HistorySettings(cleanup=cleanup), cleanup=cleanup)

    @classmethod
    def quick(cls) -> "Config":
        """A few minutes on the embedded server: small queues, still 1,000 zombies for the targets."""
        cleanup = CleanupSettings(repeats=2, cap_seconds=300.0, slow_seconds=60.0)
        return cls(
            mode="quick",
            cleanup_cases=((2_000, 100), (5_000, 1_000)),
            history=HistorySettings(
                sizes=(5_000, 20_000),
                stats_sizes=(5_000, 20_000),
                repeats=2,
                stats_repeats=1,
                cleanup=cleanup,
                growth_cleanup_sizes=(20_000,),
            ),
            cleanup=cleanup,
            compute_sizes=(100_000,),
        )

    @classmethod
    def smoke(cls) -> "Config":
        """Seconds, for the test suite: tiny queues, one run each."""
        cleanup = CleanupSettings(repeats=0, batch_size=20, cap_seconds=60.0, slow_seconds=10.0)
        return cls(
            mode="smoke",
            cleanup_cases=((500, 50),),
            history=HistorySettings(
                sizes=(200, 400),
                stats_sizes=(400,),
                zombies=20,
                running=10,
                waiting=10,
                repeats=0,
                stats_repeats=0,
                cleanup=cleanup,
                growth_cleanup_sizes=(400,),
                plans=False,
            ),
            cleanup=cleanup,
            compute_sizes=(2_000,),
        )


class Results:
    """The results dictionary, rewritten to disk (JSON, Markdown, PNG) after every measure."""

    def __init__(self, out_dir: Path, meta: dict[str, Any], log: Callable[[str], None]) -> None:
        self.out_dir = out_dir
        self.log = log
        self._chart_written = -1e9
        self.data: dict[str, Any] = {"meta": meta, "cleanup": [], "detection": [], "plans": [], "statistics": [], "compute": [], "growth_cleanup": []}
        out_dir.mkdir(parents=True, exist_ok=True)

    def emit(self, section: str, rows: list[dict[str, Any]]) -> None:
        load = round(os.getloadavg()[0], 2)  # the machine is shared: say how busy it was
        self.data[section].extend({**row, "load_average_1m": load} for row in rows)
        self.write()

    def write(self, complete: bool = False) -> None:
        meta = self.data["meta"]
        meta["written_at"] = now_iso()
        meta["complete"] = complete
        meta.setdefault("machine", {})["load_average_now"] = list(os.getloadavg())
        self.data["targets"] = report.targets(self.data)
        self.data["growth"] = report.growth_rows(self.data)
        (self.out_dir / RESULTS_JSON).write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        (self.out_dir / RESULTS_MD).write_text(report.markdown(self.data) + "\n")
        if complete or time.monotonic() - self._chart_written > 60:  # drawing takes a second: not after every row
            try:
                report.growth_chart(self.data, self.out_dir / GROWTH_PNG)
                self._chart_written = time.monotonic()
            except Exception as error:  # a chart must never lose the figures
                self.log(f"chart not written: {error!r}")


def run(config: Config, out_dir: Path, url: str | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every measure of ``config`` against ``url`` (or the embedded server); return the results."""
    log = log or (lambda line: print(line, flush=True))
    started = time.perf_counter()
    with server(url, log=log) as handle:
        meta = {
            "command": python_command() if config.mode != "smoke" else "benchmarks.run.run(Config.smoke())",
            "mode": config.mode,
            "started_at": now_iso(),
            "machine": machine_info(handle),
            "code": code_state(),
            "settings": {
                "cleanup_cases": [list(case) for case in config.cleanup_cases],
                "history_sizes": list(config.history.sizes),
                "stats_sizes": list(config.history.stats_sizes),
                "repeats": config.cleanup.repeats,
                "batch_size": config.cleanup.batch_size,
                "cap_seconds": config.cleanup.cap_seconds,
                "case_caps": {f"{jobs}:{zombies}": cap for (jobs, zombies), cap in config.case_caps.items()},
                "slow_seconds": config.cleanup.slow_seconds,
            },
        }
        results = Results(out_dir, meta, log)
        log(f"server {handle.version} at {'embedded SecantusDB' if handle.embedded else 'QUEUE_MONGO_URL'}; results in {out_dir}")
        counter = CommandCounter()
        setup_client, measured_client = new_client(handle.url), new_client(handle.url, counter)
        try:
            early = [case for case in config.cleanup_cases if case[0] < config.late_cleanup_from]
            late = [case for case in config.cleanup_cases if case[0] >= config.late_cleanup_from]
            if "cleanup" in config.sections:
                _cleanup_cases(handle, setup_client, measured_client, counter, early, config, results, log)
            if "history" in config.sections:
                log("detection, statistics and growth")
                HistoryBench(handle, setup_client, measured_client, counter, config.history, log, results.emit).run()
            if "cleanup" in config.sections:
                _cleanup_cases(handle, setup_client, measured_client, counter, late, config, results, log)
            if "compute" in config.sections:
                log("the statistics step without the server")
                for size in config.compute_sizes:
                    results.emit("compute", [compute_case(size, config.history.stats_repeats, log)])
            results.data["meta"]["total_seconds"] = round(time.perf_counter() - started, 1)
            results.write(complete=True)
        finally:
            setup_client.close()
            measured_client.close()
    _print_summary(results.data, log)
    return results.data


def code_state() -> dict[str, Any]:
    """The commit, and the measured modules as they were imported (the work tree may hold uncommitted edits)."""
    import hashlib
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    modules = [
        "zombie_pipeline/cleanup.py",
        "zombie_pipeline/detection.py",
        "zombie_pipeline/statistics/tallies.py",
        "zombie_pipeline/statistics/suggest.py",
        "zombie_pipeline/simulate.py",
    ]
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted": [line for line in git("status", "--short", "--", *modules).splitlines() if line],
        "sha1": {m: hashlib.sha1((REPO / m).read_bytes()).hexdigest()[:12] for m in modules if (REPO / m).exists()},
    }


def _cleanup_cases(handle, setup_client, measured_client, counter, cases, config, results, log) -> None:
    for jobs, zombies in cases:
        settings = config.cleanup
        if (jobs, zombies) in config.case_caps:
            settings = replace(settings, cap_seconds=config.case_caps[(jobs, zombies)])
        log(f"cleanup: {jobs} jobs, {zombies} zombies (cap {settings.cap_seconds} s per run)")
        results.emit("cleanup", cleanup_case(handle, setup_client, measured_client, counter, jobs, zombies, settings, log))


def _print_summary(data: dict[str, Any], log: Callable[[str], None]) -> None:
    log("")
    if data["cleanup"]:
        log(report.cleanup_table(data["cleanup"]))
        log("")
        log(report.ratio_table(data["cleanup"]))
        log("")
    if data["detection"]:
        log(report.detection_table(data["detection"]))
        log("")
    if data["statistics"]:
        log(report.statistics_table(data["statistics"]))
        log("")
    if data["growth"]:
        log(report.growth_table(data))
        log("")
    log(report.targets_table(data))


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(float(part)) for part in text.split(",") if part.strip())


def _cases(text: str) -> tuple[tuple[int, int], ...]:
    cases = []
    for part in text.split(","):
        jobs, _, zombies = part.partition(":")
        cases.append((int(float(jobs)), int(float(zombies))))
    return tuple(cases)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few minutes: queues of 2k and 5k jobs, history up to 20k")
    parser.add_argument("--sizes", type=_sizes, help="finished-history sizes, e.g. 10000,100000,1000000")
    parser.add_argument("--stats-sizes", type=_sizes, help="history sizes at which statistics are measured")
    parser.add_argument("--cleanup-cases", type=_cases, help="queue_jobs:zombies,... e.g. 10000:100,100000:1000")
    parser.add_argument("--repeats", type=int, help="timed runs per contender (median); default 3")
    parser.add_argument("--cap-seconds", type=float, help="stop a cleanup run after this long (default 2400; 1200 for 100000:10000)")
    parser.add_argument("--only", choices=["cleanup", "history", "compute"], help="one section only")
    parser.add_argument("--out", type=Path, help="output directory (default docs/, or build/benchmarks-quick with --quick)")
    parser.add_argument("--url", help="MongoDB URL (default: QUEUE_MONGO_URL, else an embedded SecantusDB)")
    args = parser.parse_args(argv)
    config = Config.quick() if args.quick else Config.full()
    if args.sizes:
        config.history.sizes = args.sizes
        config.history.stats_sizes = args.stats_sizes or tuple(s for s in config.history.stats_sizes if s in args.sizes) or args.sizes
    if args.stats_sizes:
        config.history.stats_sizes = args.stats_sizes
    if args.cleanup_cases:
        config.cleanup_cases = args.cleanup_cases
    if args.repeats:
        config.cleanup.repeats = config.history.repeats = args.repeats
        config.history.stats_repeats = args.repeats
    if args.cap_seconds:
        config.cleanup.cap_seconds = args.cap_seconds
        config.case_caps = {}
    if args.only:
        config.sections = (args.only,)
    out_dir = args.out or (REPO / "build" / "benchmarks-quick" if args.quick else REPO / "docs")
    run(config, out_dir, args.url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
