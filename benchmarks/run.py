"""``python -m benchmarks.run [--quick] [...]``: every measure in one run, results written as they come.

Sections: ``cleanup`` (ours and the 2023 baseline, a fresh server per run, interleaved, at injected
round-trip times), ``compute`` (the statistics step at 1M jobs without the server, the documents path
and the Arrow path), ``history`` (detection and statistics as the finished history grows) and
``detection`` (issues 29 and 35: many seeds of the chart's fleet with ground truth replayed against the
deployment's own killer, the cleanup and the watcher, ``benchmarks/replay/``). A run of some sections keeps the others' figures already
in the output directory.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.cleanup_bench import (
    OURS,
    CleanupCase,
    CleanupSettings,
    cleanup_section,
    models,
    summaries,
)
from benchmarks.compute_bench import compute_case
from benchmarks.data import TODAY_GENERATION
from benchmarks.harness import (
    CommandCounter,
    exit_on_sigterm,
    machine_info,
    new_client,
    now_iso,
    python_command,
    server_version,
)
from benchmarks.history_bench import HistoryBench, HistorySettings
from benchmarks.replay.section import ReplaySettings, replay_section
from benchmarks.servers import HistoryServer, Servers

REPO = Path(__file__).resolve().parent.parent
RESULTS_JSON = "benchmarks-results.json"
RESULTS_MD = "benchmarks-results.md"
GROWTH_PNG = "benchmarks-growth.png"
SECTIONS = ("cleanup", "compute", "history", "detection")
#: The results keys each section writes: a run of some sections keeps the others' from the file already there.
SECTION_KEYS = {
    "cleanup": ("cleanup_cases", "cleanup_runs", "cleanup", "cleanup_models"),
    "compute": ("compute",),
    "history": ("detection", "plans", "statistics"),
    "detection": ("replay",),
}


def default_cases() -> tuple[CleanupCase, ...]:
    """The 2023 queue with the deployment's ~30 job types, both contenders at every RTT; the same with 3 types
    (ours, for the commands: they must not grow with the types); today's queue (ours: the deployment's
    collections written around a finish)."""
    return (
        CleanupCase("2023-01", 10_000, 1_000, 30),
        CleanupCase("2023-01", 10_000, 1_000, 3, (OURS,), (0.0,)),
        CleanupCase(TODAY_GENERATION, 10_000, 1_000, 30, (OURS,), (0.0,)),
    )


@dataclass
class Config:
    mode: str = "full"
    cleanup_cases: tuple[CleanupCase, ...] = field(default_factory=default_cases)
    cleanup: CleanupSettings = field(default_factory=CleanupSettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    #: statistics step fed from memory (``compute_bench``): its targets are at 1M jobs
    compute_sizes: tuple[int, ...] = (1_000_000,)
    compute_repeats: int = 5
    replay: ReplaySettings = field(default_factory=ReplaySettings)
    sections: tuple[str, ...] = SECTIONS

    @classmethod
    def full(cls) -> Config:
        cleanup = CleanupSettings()
        return cls(cleanup=cleanup, history=HistorySettings(cleanup=cleanup))

    @classmethod
    def quick(cls) -> Config:
        """A few minutes on the embedded server: small queues, still 1,000 zombies for the targets."""
        cleanup = CleanupSettings(repeats=2, cap_seconds=300.0)
        return cls(
            mode="quick",
            cleanup_cases=(
                CleanupCase("2023-01", 3_000, 1_000, 30),
                CleanupCase("2023-01", 3_000, 1_000, 3, (OURS,), (0.0,)),
            ),
            cleanup=cleanup,
            history=HistorySettings(
                sizes=(5_000, 20_000), stats_sizes=(5_000, 20_000), repeats=2, stats_repeats=1, cleanup=cleanup
            ),
            compute_sizes=(100_000,),
            compute_repeats=2,
            replay=ReplaySettings.quick(),
        )

    @classmethod
    def smoke(cls) -> Config:
        """Seconds, for the test suite: tiny queues, one timed run each, RTT 0 and 1 ms."""
        cleanup = CleanupSettings(repeats=1, rtts_ms=(0.0, 1.0), batch_size=20, cap_seconds=60.0, pings=5)
        return cls(
            mode="smoke",
            cleanup_cases=(
                CleanupCase("2023-01", 500, 50, 30),
                CleanupCase("2023-01", 500, 50, 3, (OURS,), (0.0,)),
                CleanupCase(TODAY_GENERATION, 500, 50, 30, (OURS,), (0.0,)),
            ),
            cleanup=cleanup,
            history=HistorySettings(
                sizes=(200, 400),
                stats_sizes=(400,),
                zombies=20,
                running=10,
                waiting=10,
                repeats=0,
                stats_repeats=0,
                cleanup=cleanup,
                plans=False,
            ),
            compute_sizes=(2_000,),
            compute_repeats=1,
            sections=tuple(section for section in SECTIONS if section != "detection"),  # its own test: test_replay.py
        )


class Results:
    """The results dictionary, rewritten to disk (JSON, Markdown, PNG) after every measure."""

    def __init__(
        self,
        out_dir: Path,
        meta: dict[str, Any],
        log: Callable[[str], None],
        sections: tuple[str, ...] = SECTIONS,
    ) -> None:
        self.out_dir = out_dir
        self.log = log
        self._chart_written = -1e9
        self.meta = meta  # this run's; the file's own when this run only replays (its other figures are kept)
        self.measures_cleanup = "cleanup" in sections  # else its summaries are kept as the file holds them
        self.data: dict[str, Any] = {
            "meta": meta,
            "cleanup_cases": [],
            "cleanup_runs": [],
            "cleanup": [],
            "cleanup_models": [],
            "detection": [],
            "plans": [],
            "statistics": [],
            "compute": [],
            "replay": {},
        }
        out_dir.mkdir(parents=True, exist_ok=True)
        self._keep_other_sections(sections)

    def _keep_other_sections(self, sections: tuple[str, ...]) -> None:
        """The figures of the sections this run does not measure, as the results file there holds them."""
        path = self.out_dir / RESULTS_JSON
        if set(sections) == set(SECTIONS) or not path.exists():
            return
        try:
            previous = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            self.log(f"the results there cannot be read, only this run's are written: {error!r}")
            return
        for section, keys in SECTION_KEYS.items():
            if section not in sections:
                self.data.update({key: previous[key] for key in keys if key in previous})
        if "detection" in sections and not set(sections) - {"detection"} and "meta" in previous:
            self.data["meta"] = previous["meta"]  # the other sections' run, described as it was
            self.meta["only"] = "detection"

    def emit(self, section: str, rows: list[dict[str, Any]]) -> None:
        load = round(os.getloadavg()[0], 2)  # the machine is shared: say how busy it was
        self.data[section].extend({**row, "load_average_1m": load} for row in rows)
        self.write()

    def replay(self, replay: dict[str, Any]) -> None:
        self.data["replay"] = {**replay, "meta": self.meta, "load_average_1m": round(os.getloadavg()[0], 2)}
        self.write()

    def write(self, complete: bool = False) -> None:
        meta = self.meta
        meta["written_at"] = now_iso()
        meta["complete"] = complete
        meta.setdefault("machine", {})["load_average_now"] = list(os.getloadavg())
        if self.measures_cleanup:
            runs = self.data["cleanup_runs"]
            self.data["cleanup"] = summaries(runs)  # computed from the runs alone: a partial run still renders
            self.data["cleanup_models"] = models(runs)
        self.data["targets"] = report.targets(self.data)
        self.data["growth"] = report.growth_rows(self.data)
        (self.out_dir / RESULTS_JSON).write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        (self.out_dir / RESULTS_MD).write_text(report.markdown(self.data) + "\n")
        if self.data["growth"] and (complete or time.monotonic() - self._chart_written > 60):  # a second to draw
            try:
                report.growth_chart(self.data, self.out_dir / GROWTH_PNG)
                self._chart_written = time.monotonic()
            except Exception as error:  # a chart must never lose the figures
                self.log(f"chart not written: {error!r}")


def run(
    config: Config, out_dir: Path, url: str | None = None, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run every measure of ``config`` against ``url`` (or fresh embedded servers); return the results."""
    log = log or (lambda line: print(line, flush=True))
    url = url or os.environ.get("QUEUE_MONGO_URL") or None
    started = time.perf_counter()
    with exit_on_sigterm():
        servers = Servers(url, log=log)
        try:
            meta: dict[str, Any] = {
                "command": python_command() if config.mode != "smoke" else "benchmarks.run.run(Config.smoke())",
                "mode": config.mode,
                "started_at": now_iso(),
                "machine": machine_info(
                    servers.embedded, server_version(url) if url else "(a fresh SecantusDB per run)"
                ),
                "code": code_state(),
                "settings": {
                    "sections": list(config.sections),
                    "cleanup_cases": [
                        case.key
                        + ("" if case.rtts_ms is None else f" at {'/'.join(f'{r:g}' for r in case.rtts_ms)} ms")
                        + f" ({'+'.join(case.contenders)})"
                        for case in config.cleanup_cases
                    ],
                    "rtts_ms": list(config.cleanup.rtts_ms),
                    "repeats": config.cleanup.repeats,
                    "batch_size": config.cleanup.batch_size,
                    "cap_seconds": config.cleanup.cap_seconds,
                    "history_sizes": list(config.history.sizes),
                    "stats_sizes": list(config.history.stats_sizes),
                    "history_repeats": config.history.repeats,
                    "compute_sizes": list(config.compute_sizes),
                    "compute_repeats": config.compute_repeats,
                },
                "notes": servers.notes,
            }
            results = Results(out_dir, meta, log, config.sections)
            log(
                f"servers: {'a fresh embedded SecantusDB per run' if servers.embedded else 'QUEUE_MONGO_URL'}; results in {out_dir}"
            )
            if "cleanup" in config.sections and config.cleanup_cases:
                log(
                    f"cleanup: {len(config.cleanup_cases)} cases, injected RTT {', '.join(f'{r:g}' for r in config.cleanup.rtts_ms)} ms, {config.cleanup.repeats} repetitions"
                )
                cleanup_section(servers, config.cleanup_cases, config.cleanup, log, results.emit)
            if "compute" in config.sections:
                log("the statistics step without the server (documents vs Arrow)")
                for size in config.compute_sizes:
                    results.emit("compute", compute_case(size, config.compute_repeats, log))
            if "history" in config.sections and config.history.sizes:
                log("detection and statistics as the history grows (one long-lived server)")
                _history(servers, config, results, log)
            if "detection" in config.sections:
                results.replay(replay_section(config.replay, url, out_dir, log))
            meta["servers_started"] = servers.started
            meta["total_seconds"] = round(time.perf_counter() - started, 1)
            results.write(complete=True)
        finally:
            servers.close()
    _print_summary(results.data, log)
    return results.data


def _history(servers: Servers, config: Config, results: Results, log: Callable[[str], None]) -> None:
    history = HistoryServer(servers).start()
    counter = CommandCounter()
    setup_client, measured_client = new_client(history.url), new_client(history.url, counter)
    try:
        HistoryBench(history, setup_client, measured_client, counter, config.history, log, results.emit).run()
    finally:
        setup_client.close()
        measured_client.close()
        history.stop()


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
        "zombie_pipeline/cleanup/run.py",
        "zombie_pipeline/cleanup/finalizer.py",
        "zombie_pipeline/cleanup/strategies.py",
        "zombie_pipeline/cleanup/detection.py",
        "zombie_pipeline/statistics/jobs_source.py",
        "zombie_pipeline/statistics/analysis.py",
        "zombie_pipeline/simulation/simulator.py",
    ]
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted": [line for line in git("status", "--short", "--", *modules).splitlines() if line],
        "sha1": {m: hashlib.sha1((REPO / m).read_bytes()).hexdigest()[:12] for m in modules if (REPO / m).exists()},
    }


def _print_summary(data: dict[str, Any], log: Callable[[str], None]) -> None:
    log("")
    if data["cleanup"]:
        log(report.cleanup_table(data["cleanup"]))
        log("")
        log(report.written_table(data["cleanup"]))
        log("")
        log(report.ratio_table(data["cleanup"]))
        log("")
        log(report.models_table(data["cleanup_models"]))
        log("")
    if data["compute"]:
        log(report.compute_table(data["compute"]))
        log("")
    if data["detection"]:
        log(report.detection_table(data["detection"]))
        log("")
    if data["statistics"]:
        log(report.statistics_table(data["statistics"]))
        log("")
    if data.get("replay"):
        log(report.replay_markdown(data["replay"]))
        log("")
    log(report.targets_table(data))


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(float(part)) for part in text.split(",") if part.strip())


def _cases(text: str) -> tuple[CleanupCase, ...]:
    return tuple(CleanupCase.parse(part) for part in text.split(",") if part.strip())


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(",") if part.strip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a few minutes: small queues, history up to 20k, statistics at 100k"
    )
    parser.add_argument(
        "--cleanup-cases",
        type=_cases,
        help="GENERATION:JOBS:ZOMBIES[:TYPES[:CONTENDERS[:RTTS]]],... e.g. 2023-01:10000:1000:30,2023-01:10000:1000:3:ours:0",
    )
    parser.add_argument("--rtts", type=_floats, help="injected round-trip times in ms (default 0,1,3)")
    parser.add_argument("--repeats", type=int, help="timed runs per cleanup case, contender and RTT (default 5)")
    parser.add_argument("--cap-seconds", type=float, help="stop a cleanup run after this long (default 900)")
    parser.add_argument(
        "--compute-sizes",
        type=_sizes,
        help="finished jobs for the statistics step without the server (default 1000000)",
    )
    parser.add_argument("--compute-repeats", type=int, help="timed runs per statistics path (default 5)")
    parser.add_argument("--sizes", type=_sizes, help="finished-history sizes, e.g. 10000,100000,1000000")
    parser.add_argument("--stats-sizes", type=_sizes, help="history sizes at which statistics are read from the server")
    parser.add_argument("--only", help=f"comma-separated sections among {', '.join(SECTIONS)}")
    replay = parser.add_argument_group("detection (the replay of issues 29 and 35)")
    replay.add_argument("--replay-seeds", type=int, help="seeds of the chart's fleet, a day each (default 20)")
    replay.add_argument("--replay-incident-seeds", type=int, help="seeds of the cluster incident (default 5)")
    replay.add_argument("--replay-parallel", type=int, help="seeds replayed at once (default 2)")
    replay.add_argument("--replay-no-witness", action="store_true", help="skip the real cleanup's witness seed")
    replay.add_argument(
        "--replay-witness-from",
        type=Path,
        metavar="RESULTS_JSON",
        help="reuse the witness a previous run recorded there (e.g. docs/benchmarks-results.json), labelled as its own",
    )
    replay.add_argument("--heartbeat-timeout", type=int, help="the cleanup's heartbeat timeout (default 300)")
    replay.add_argument("--max-duration", type=int, help="the cleanup's T2 for every type (default 2520)")
    replay.add_argument(
        "--deployment-finish", type=float, help="seconds of one set_stuck in a pass (default: the model)"
    )
    parser.add_argument(
        "--out", type=Path, help="output directory (default docs/, or build/benchmarks-quick with --quick)"
    )
    parser.add_argument(
        "--url", help="MongoDB URL (default: QUEUE_MONGO_URL, else a fresh embedded SecantusDB per run)"
    )
    args = parser.parse_args(argv)
    config = Config.quick() if args.quick else Config.full()
    if args.cleanup_cases:
        config.cleanup_cases = args.cleanup_cases
    if args.rtts:
        config.cleanup.rtts_ms = args.rtts
    if args.repeats:
        config.cleanup.repeats = config.history.repeats = config.history.stats_repeats = args.repeats
    if args.cap_seconds:
        config.cleanup.cap_seconds = args.cap_seconds
    if args.compute_sizes:
        config.compute_sizes = args.compute_sizes
    if args.compute_repeats:
        config.compute_repeats = args.compute_repeats
    if args.sizes:
        config.history.sizes = args.sizes
        config.history.stats_sizes = args.stats_sizes or tuple(s for s in config.history.stats_sizes if s in args.sizes)
    if args.stats_sizes:
        config.history.stats_sizes = args.stats_sizes
    _replay_options(args, config)
    if args.only:
        sections = tuple(part.strip() for part in args.only.split(",") if part.strip())
        unknown = set(sections) - set(SECTIONS)
        if unknown:
            parser.error(f"unknown sections {sorted(unknown)}")
        config.sections = sections
    out_dir = args.out or (REPO / "build" / "benchmarks-quick" if args.quick else REPO / "docs")
    run(config, out_dir, args.url)
    return 0


def _replay_options(args: argparse.Namespace, config: Config) -> None:
    replay = config.replay
    if args.replay_seeds:
        replay.seeds = args.replay_seeds
    if args.replay_incident_seeds is not None:
        replay.incident_seeds = args.replay_incident_seeds
    if args.replay_parallel:
        replay.parallel = args.replay_parallel
    if args.replay_no_witness:
        replay.witness = False
    if args.replay_witness_from:
        replay.witness_from = args.replay_witness_from
    if args.heartbeat_timeout:
        replay.heartbeat_timeout_seconds = args.heartbeat_timeout
    if args.max_duration:
        replay.max_duration_seconds = args.max_duration
    if args.deployment_finish:
        replay.deployment = replace(replay.deployment, finish_seconds=args.deployment_finish)


if __name__ == "__main__":
    sys.exit(main())
